/* tests/quant_oracle.h - the float64 oracle of the weight formats, shared by
 * the quant tests: element values found from the format definitions, sharing
 * no code with engine/, and random valid rows of every type. */
#ifndef TEST_QUANT_ORACLE_H
#define TEST_QUANT_ORACLE_H

#include "test.h"

#include <stdint.h>

double ref_half(const uint8_t *p);                          /* IEEE half at p, little-endian */
double ref_value(int type, const uint8_t *row, int64_t e);  /* element e of a row of `type` */
/* n elements of random but valid data of `type` into dst (llm_row_bytes bytes) */
void random_row(test_rng *r, int type, int64_t n, uint8_t *dst);
void put_half(uint8_t *p, float v);                          /* v rounded to a half, little-endian */

extern const int all_types[];   /* every type the engine decodes */
extern const int n_all_types;

#endif
