/* src/attend_tmpl.h - the online-softmax attention kernel, written once and
 * instantiated by src/attend.c for REAL = double (the reference path: f64
 * storage, f64 arithmetic) and REAL = float (FP32 accumulation over any
 * storage type). Define REAL and KFN(name) before including. */

/* Loads K and V of positions [j0, j0 + n) as REAL [n][d], across blocks. */
static void KFN(load_keys)(const key_source *src, int32_t j0, int32_t n, REAL *k, REAL *v) {
    for (int32_t j = 0; j < n;) {
        const int32_t blk = (j0 + j) / src->block, in_blk = (j0 + j) - blk * src->block;
        const key_block kb = source_block(src, blk);
        for (int32_t r = in_blk; r < src->block && j < n; r++, j++) {
            const size_t off = (size_t)r * src->stride;
#if KV_TMPL_F64
            memcpy(k + (size_t)j * src->d, kb.k + off, (size_t)src->d * sizeof(double));
            memcpy(v + (size_t)j * src->d, kb.v + off, (size_t)src->d * sizeof(double));
#else
            kv_load_row(src->dtype, kb.k + off, kb.kscale ? kb.kscale[r] : 1.0f, k + (size_t)j * src->d, src->d);
            kv_load_row(src->dtype, kb.v + off, kb.vscale ? kb.vscale[r] : 1.0f, v + (size_t)j * src->d, src->d);
#endif
        }
    }
}

/* One (sequence, KV head) group: `rows` query rows, each with the G query
 * heads that share this KV head. Query vector (r, h) is at q[r * q_stride + h * d]
 * and row r sits at absolute position pos0 + r.
 *
 * Online softmax per query vector: a running max m, a running sum l of
 * exp(s - m) and an accumulator acc of exp(s - m) * v. A new chunk with max
 * m' > m rescales both by exp(m - m'), so the result equals the softmax over
 * all visible keys without a score row of length S ever existing. Every row
 * sees at least its own key, so l > 0 and no row is NaN. */
static void KFN(attend_group)(const key_source *src, const REAL *q, REAL *out, size_t q_stride,
                              int32_t rows, int32_t G, int32_t pos0, int32_t window, REAL scale) {
    const int32_t d = src->d;
    const int32_t qmax = ATT_ACC_ELEMS / d < 1 ? 1 : ATT_ACC_ELEMS / d;
    const int32_t kmax = ATT_CHUNK_ELEMS / d < 1 ? 1 : ATT_CHUNK_ELEMS / d;
    REAL acc[ATT_ACC_ELEMS], m[ATT_ACC_ELEMS], l[ATT_ACC_ELEMS];
    REAL kbuf[ATT_CHUNK_ELEMS], vbuf[ATT_CHUNK_ELEMS], s[ATT_CHUNK_ELEMS];
    const int32_t n_vec = rows * G;

    for (int32_t v0 = 0; v0 < n_vec; v0 += qmax) {
        const int32_t v1 = v0 + qmax < n_vec ? v0 + qmax : n_vec;
        for (int32_t i = 0; i < v1 - v0; i++) {
            m[i] = -INFINITY;
            l[i] = 0;
            memset(acc + (size_t)i * d, 0, (size_t)d * sizeof(REAL));
        }
        /* keys any vector of this tile may see */
        const int32_t first_pos = pos0 + v0 / G, last_pos = pos0 + (v1 - 1) / G;
        const int32_t lo = window > 0 && first_pos - window + 1 > 0 ? first_pos - window + 1 : 0;
        for (int32_t j0 = lo; j0 <= last_pos;) {
            /* chunks end at multiples of kmax in absolute position, so the
             * order of the softmax updates, hence every rounding, is the same
             * whatever the page size or the layout of the keys */
            int32_t n = kmax - j0 % kmax;
            if (n > last_pos - j0 + 1) n = last_pos - j0 + 1;
            KFN(load_keys)(src, j0, n, kbuf, vbuf);

            for (int32_t vi = v0; vi < v1; vi++) {
                const int32_t r = vi / G, h = vi % G, pos = pos0 + r;
                /* visible: pos - window < j <= pos */
                int32_t jlo = j0, jhi = j0 + n - 1;
                if (window > 0 && jlo < pos - window + 1) jlo = pos - window + 1;
                if (jhi > pos) jhi = pos;
                if (jlo > jhi) continue;
                const REAL *qv = q + (size_t)r * q_stride + (size_t)h * d;
                REAL *a = acc + (size_t)(vi - v0) * d;
                REAL mx = m[vi - v0];
                for (int32_t j = jlo; j <= jhi; j++) {
                    const REAL *kr = kbuf + (size_t)(j - j0) * d;
                    REAL dot = 0;
                    for (int32_t e = 0; e < d; e++) dot += qv[e] * kr[e];
                    s[j - jlo] = dot * scale;
                    if (s[j - jlo] > mx) mx = s[j - jlo];
                }
                const REAL corr = KFN(exp)(m[vi - v0] - mx); /* 0 on the first chunk */
                REAL sum = l[vi - v0] * corr;
                for (int32_t e = 0; e < d; e++) a[e] *= corr;
                for (int32_t j = jlo; j <= jhi; j++) {
                    const REAL p = KFN(exp)(s[j - jlo] - mx);
                    const REAL *vr = vbuf + (size_t)(j - j0) * d;
                    sum += p;
                    for (int32_t e = 0; e < d; e++) a[e] += p * vr[e];
                }
                m[vi - v0] = mx;
                l[vi - v0] = sum;
            }
            j0 += n;
        }
        for (int32_t vi = v0; vi < v1; vi++) {
            const int32_t r = vi / G, h = vi % G;
            REAL *o = out + (size_t)r * q_stride + (size_t)h * d;
            const REAL inv = 1 / l[vi - v0];
            for (int32_t e = 0; e < d; e++) o[e] = acc[(size_t)(vi - v0) * d + e] * inv;
        }
    }
}
