#include "common/utf8.h"

int pf_utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k = c < 0x80             ? 0
                   : (c & 0xe0) == 0xc0 ? 1
                   : (c & 0xf0) == 0xe0 ? 2
                   : (c & 0xf8) == 0xf0 ? 3
                                        : 9;
        if (k == 9 || k > n - i - 1)
            return 0;
        uint32_t cp = k == 0 ? c : k == 1 ? c & 0x1fu : k == 2 ? c & 0x0fu : c & 0x07u;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}
