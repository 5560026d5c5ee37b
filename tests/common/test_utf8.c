/* pf_utf8_valid against RFC 3629's rules, each case written by hand: ASCII and NUL; the shortest encodings
 * of 2, 3 and 4 bytes at their lower and upper ends (U+0080, U+07FF, U+0800, U+FFFF, U+10000, U+10FFFF);
 * overlong forms (C0 80, E0 80 80, F0 80 80 80), surrogates (ED A0 80 = U+D800, ED BF BF = U+DFFF), a code
 * point past U+10FFFF (F4 90 80 80), stray continuation bytes, bytes F8-FF, sequences cut short. Then every
 * one of the 2^16 two-byte strings against Python's decoder rules written out: valid iff ASCII ASCII, or a
 * lead C2-DF followed by a continuation byte. */
#include <stdio.h>
#include <string.h>

#include "common/utf8.h"
#include "tests/check.h"

static void one(const char *what, const char *bytes, size_t n, int want)
{
    int got = pf_utf8_valid((const uint8_t *)bytes, n);
    check(got == want, "%s: %d (want %d)", what, got, want);
}

int main(void)
{
    one("empty", "", 0, 1);
    one("ASCII", "pfcps_worker_step", 17, 1);
    one("NUL", "a\0b", 3, 1);
    one("U+0080", "\xc2\x80", 2, 1);
    one("U+07FF", "\xdf\xbf", 2, 1);
    one("U+0800", "\xe0\xa0\x80", 3, 1);
    one("U+FFFF", "\xef\xbf\xbf", 3, 1);
    one("U+10000", "\xf0\x90\x80\x80", 4, 1);
    one("U+10FFFF", "\xf4\x8f\xbf\xbf", 4, 1);
    one("overlong NUL C0 80", "\xc0\x80", 2, 0);
    one("overlong C1 BF", "\xc1\xbf", 2, 0);
    one("overlong E0 80 80", "\xe0\x80\x80", 3, 0);
    one("overlong E0 9F BF", "\xe0\x9f\xbf", 3, 0);
    one("overlong F0 80 80 80", "\xf0\x80\x80\x80", 4, 0);
    one("overlong F0 8F BF BF", "\xf0\x8f\xbf\xbf", 4, 0);
    one("surrogate U+D800", "\xed\xa0\x80", 3, 0);
    one("surrogate U+DFFF", "\xed\xbf\xbf", 3, 0);
    one("U+D7FF", "\xed\x9f\xbf", 3, 1);
    one("U+E000", "\xee\x80\x80", 3, 1);
    one("U+110000", "\xf4\x90\x80\x80", 4, 0);
    one("stray continuation", "a\x80", 2, 0);
    one("F8 lead", "\xf8\x88\x80\x80\x80", 5, 0);
    one("FF", "\xff", 1, 0);
    one("cut 2 of 3", "\xe2\x82", 2, 0);
    one("cut 3 of 4", "\xf0\x9f\x98", 3, 0);
    one("lead then ASCII", "\xc3" "a", 2, 0);
    one("euro sign", "\xe2\x82\xac", 3, 1);
    int bad = 0;
    for (int a = 0; a < 256; a++)
        for (int b = 0; b < 256; b++) {
            uint8_t s[2] = {(uint8_t)a, (uint8_t)b};
            int want = (a < 0x80 && b < 0x80) || (a >= 0xc2 && a <= 0xdf && (b & 0xc0) == 0x80);
            bad += pf_utf8_valid(s, 2) != want;
        }
    check(bad == 0, "all 65536 two-byte strings: %d disagree with the rule", bad);
    return check_summary();
}
