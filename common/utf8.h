/* UTF-8 validation for text that arrives from outside (a scraped metrics page, a pickle's strings). */
#ifndef PFCPS_COMMON_UTF8_H
#define PFCPS_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* 1 when s[0..n) is valid UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates (U+D800-U+DFFF), no
 * code point past U+10FFFF, no truncated sequence; 0 otherwise. NUL bytes are valid (U+0000); callers that
 * refuse them check separately. */
int pf_utf8_valid(const uint8_t *s, size_t n);

#endif
