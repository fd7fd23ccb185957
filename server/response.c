/* server/response.c - replies and the small JSON pieces every reply uses:
 * a body, JSON and error replies, whether the client is still there, text as
 * a valid JSON string whatever its bytes, token bytes, finish reasons, usage. */
#include "internal.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- replies */

int srv_reply_body(srv *s, struct mg_connection *conn, int status, const char *type, const char *body, size_t len,
                   const char *header, const char *value) {
    char clen[32];
    snprintf(clen, sizeof clen, "%zu", len);
    mg_response_header_start(conn, status);
    mg_response_header_add(conn, "Content-Type", type, -1);
    mg_response_header_add(conn, "Content-Length", clen, -1);
    if (header) mg_response_header_add(conn, header, value, -1);
    mg_response_header_send(conn);
    const char *method = mg_get_request_info(conn)->request_method;   /* NULL when the request line was bad */
    if (!method || strcmp(method, "HEAD")) mg_write(conn, body, len);   /* HEAD: headers only */
    srv_metrics_status(&s->metrics, status);
    return status;
}

static int reply_json_with(srv *s, struct mg_connection *conn, int status, json_t *body, const char *header,
                           const char *value) {
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) return srv_reply_body(s, conn, 500, "text/plain", "out of memory\n", 14, NULL, NULL);
    srv_reply_body(s, conn, status, "application/json", text, strlen(text), header, value);
    free(text);
    return status;
}

int srv_reply_json(srv *s, struct mg_connection *conn, int status, json_t *body) {
    return reply_json_with(s, conn, status, body, NULL, NULL);
}

static json_t *error_body(const srv_error *e) {
    return json_pack("{s:{s:s, s:s, s:i}}", "error", "message", e->message, "type", e->type, "code", e->status);
}

int srv_reply_error(srv *s, struct mg_connection *conn, const srv_error *e) {
    return srv_reply_json(s, conn, e->status, error_body(e));
}

int srv_reply_error_header(srv *s, struct mg_connection *conn, const srv_error *e, const char *header,
                           const char *value) {
    return reply_json_with(s, conn, e->status, error_body(e), header, value);
}

/* ---------------------------------------------------------------- the client's socket */

/* A socket address as civetweb writes it (numeric host) and its port. */
static int addr_text(const struct sockaddr_storage *a, char *host, size_t cap, int *port) {
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)a;
        *port = ntohs(in->sin_port);
        return inet_ntop(AF_INET, &in->sin_addr, host, (socklen_t)cap) ? 0 : -1;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)a;
        *port = ntohs(in6->sin6_port);
        return inet_ntop(AF_INET6, &in6->sin6_addr, host, (socklen_t)cap) ? 0 : -1;
    }
    return -1;
}

/* civetweb 1.15 does not hand out a connection's socket: it is the one of
 * this process whose peer is the request's remote address and port and whose
 * local port is the server's. -1 when none is found. */
int srv_conn_socket(const struct mg_connection *conn) {
    const struct mg_request_info *ri = mg_get_request_info(conn);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    for (struct dirent *de; found < 0 && (de = readdir(d));) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        struct stat st;
        if (*end || end == de->d_name || fd == dirfd(d) || fstat((int)fd, &st) || !S_ISSOCK(st.st_mode)) continue;
        struct sockaddr_storage peer, local;
        socklen_t np = sizeof peer, nl = sizeof local;
        char host[64], local_host[64];
        int pport, lport;
        if (getpeername((int)fd, (struct sockaddr *)&peer, &np) || getsockname((int)fd, (struct sockaddr *)&local, &nl) ||
            addr_text(&peer, host, sizeof host, &pport) || addr_text(&local, local_host, sizeof local_host, &lport))
            continue;
        if (pport == ri->remote_port && lport == ri->server_port && !strcmp(host, ri->remote_addr)) found = (int)fd;
    }
    closedir(d);
    return found;
}

/* Whether the client closed its end (or the connection broke): a request it
 * no longer waits for. A client that half-closes after sending counts as gone. */
int srv_client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}


/* Length of the valid UTF-8 sequence at p[0..n) (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;   /* overlong */
    if (c == 0xED && p[1] > 0x9F) return 0;   /* surrogates */
    if (c == 0xF0 && p[1] < 0x90) return 0;   /* overlong */
    if (c == 0xF4 && p[1] > 0x8F) return 0;   /* above U+10FFFF */
    return len;
}

json_t *srv_json_text(const char *text, size_t len) {
    json_t *s = json_stringn(text, len);
    if (s) return s;
    char *buf = malloc(len * 3 + 1);   /* each bad byte becomes 3 bytes of U+FFFD */
    if (!buf) return json_string("");
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq((const unsigned char *)text + i, len - i);
        if (k) {
            memcpy(buf + o, text + i, k), o += k, i += k;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3), o += 3, i++;
        }
    }
    s = json_stringn(buf, o);
    free(buf);
    return s ? s : json_string("");
}

json_t *srv_json_bytes(const char *text, size_t len) {
    json_t *a = json_array();
    for (size_t i = 0; i < len; i++) json_array_append_new(a, json_integer((unsigned char)text[i]));
    return a;
}

const char *srv_finish_reason(kve_stop_reason r) {
    if (r == KVE_STOP_CANCEL) return "abort";   /* the server stopped: the answer is cut, not finished */
    return r == KVE_STOP_LENGTH || r == KVE_STOP_CONTEXT ? "length" : "stop";
}

json_t *srv_json_usage(int32_t n_prompt, int32_t n_cached, int32_t n_generated) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", n_prompt, "completion_tokens", n_generated,
                     "total_tokens", n_prompt + n_generated, "prompt_tokens_details", "cached_tokens", n_cached);
}
