// The row gather / scatter, SGD / AdamW and unscale kernels of kernels/cuda/head.cu
// (kernels/cuda/head_util_kernels.cuh) run on the CPU through tests/kernels/cuda/cuda_emu.h, with grids smaller
// than the data so that the grid-stride loops wrap (no GPU needed; cuda_head runs them on a GPU):
//  - SGD with and without momentum, AdamW (3 steps, constants from adamw_consts_of as cuda_adamw_step)
//    against the CPU device's optimizer loops (kernels/cpu/optim_cpu.h): bit for bit, the kernels' claim;
//  - gather vs a host loop (exact), an out-of-range index -> its row NaN and the smallest bad row
//    recorded; scatter-add with duplicate indices vs a float64 host sum (rel <= 1e-6), scatter
//    (assignment) exact, out-of-range recorded and skipped;
//  - unscale: multiplication by 1/4 exact, found_inf 0, then 1 with an inf and with a NaN.
// Random sizes and values each run (seed printed; PFCPS_TEST_SEED replays).
#include "tests/kernels/cuda/cuda_emu.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include <vector>

// What the kernels use beyond cuda_emu.h. Blocks run one at a time on one OS thread, so plain
// read-modify-writes are atomic; each rounded operation is one C++ float operation (this file is
// compiled with -ffp-contract=off, as the CPU optimizers are without FMA).
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v)
{
    unsigned long long old = *p;
    if (v < old)
        *p = v;
    return old;
}
static inline float atomicAdd(float *p, float v)
{
    float old = *p;
    *p = old + v;
    return old;
}
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
}
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
static inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}

extern "C" {
#include "kernels/cpu/optim_cpu.h"
}

#include "kernels/cuda/head_util_kernels.cuh"
#include "tests/check.h"

static size_t same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    size_t diff = 0;
    for (size_t i = 0; i < a.size(); i++)
        diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return diff;
}

static void sgd_case(bool momentum)
{
    size_t n = 1000 + rnd() % 5000;
    std::vector<float> w(n), g(n), m(n);
    for (size_t i = 0; i < n; i++)
        w[i] = frand(-1, 1), g[i] = frand(-1, 1), m[i] = frand(-0.1f, 0.1f);
    std::vector<float> w2 = w, m2 = m;
    float lr = 0.1f, mom = momentum ? 0.9f : 0.0f, wd = 5e-4f;
    unsigned grid = 1 + (unsigned)(rnd() % 5);
    for (int step = 0; step < 3; step++) {
        optim_cpu_sgd(w.data(), g.data(), momentum ? m.data() : NULL, n, lr, mom, wd);
        float *pw = w2.data(), *pm = m2.data();
        const float *pg = g.data();
        int use_mom = momentum; // cuda_sgd_step: momentum != 0 && mom != NULL
        emu_launch(grid, 64, [&] { sgd_k(pw, pg, pm, n, lr, mom, wd, use_mom); });
    }
    size_t dw = same_bits(w, w2), dm = same_bits(m, m2);
    check(dw == 0 && dm == 0,
          "sgd%s n %zu, 3 steps, grid %u x 64: %zu weights and %zu momenta differ in bits from "
          "optim_cpu_sgd",
          momentum ? " momentum 0.9" : " without momentum", n, grid, dw, dm);
}

static void adamw_case()
{
    size_t n = 1000 + rnd() % 5000;
    std::vector<float> w(n), g(n), m(n, 0.0f), v(n, 0.0f);
    for (size_t i = 0; i < n; i++)
        w[i] = frand(-1, 1);
    std::vector<float> w2 = w, m2 = m, v2 = v;
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05; // PyTorch's betas and eps
    unsigned grid = 1 + (unsigned)(rnd() % 5);
    for (int step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++)
            g[i] = frand(-1, 1);
        optim_cpu_adamw(w.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step);
        adamw_consts c = adamw_consts_of(lr, b1, b2, eps, wd, step);
        float *pw = w2.data(), *pm = m2.data(), *pv = v2.data();
        const float *pg = g.data();
        emu_launch(grid, 64, [&] {
            adamw_k(pw, pg, pm, pv, n, c.step_size, c.bc2_sqrt, c.decay, c.omb1, c.b2, c.omb2, c.eps);
        });
    }
    size_t dw = same_bits(w, w2), dm = same_bits(m, m2), dv = same_bits(v, v2);
    check(dw == 0 && dm == 0 && dv == 0,
          "adamw n %zu, 3 steps, grid %u x 64: %zu / %zu / %zu of w / m / v differ in bits from "
          "optim_cpu_adamw",
          n, grid, dw, dm, dv);
}

static void rows_case()
{
    int R = 50 + (int)(rnd() % 200), d = 1 + (int)(rnd() % 130), k = 2 + (int)(rnd() % 40);
    std::vector<float> table((size_t)R * d), rows((size_t)k * d), out((size_t)k * d, NAN);
    std::vector<int64_t> idx(k);
    for (auto &x : table)
        x = frand(-1, 1);
    for (auto &x : rows)
        x = frand(-1, 1);
    for (int i = 0; i < k; i++)
        idx[i] = (int64_t)(rnd() % (uint64_t)R);
    unsigned grid = 1 + (unsigned)(rnd() % 3);
    float *po = out.data(), *pt = table.data();
    const float *pr = rows.data();
    const int64_t *pi = idx.data();
    g_bad_row = ~0ull;
    emu_launch(grid, 64, [&] { gather_k(po, pt, R, pi, k, d); });
    bool same = g_bad_row == ~0ull;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++)
            same &= out[(size_t)i * d + j] == table[(size_t)idx[i] * d + j];
    check(same, "gather %d rows of %d from a %d-row table, grid %u x 64: exact, no bad row", k, d, R, grid);

    // scatter-add: duplicates summed (float adds in index order; vs float64)
    std::vector<double> ref(table.begin(), table.end());
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++)
            ref[(size_t)idx[i] * d + j] += rows[(size_t)i * d + j];
    emu_launch(grid, 64, [&] { scatter_k(pt, R, pr, pi, k, d, 1); });
    double num = 0, den = 0;
    for (size_t e = 0; e < table.size(); e++)
        num += (table[e] - ref[e]) * (table[e] - ref[e]), den += ref[e] * ref[e];
    check(sqrt(num / den) <= 1e-6 && g_bad_row == ~0ull, "scatter-add %d rows: rel %.2e vs float64 host sum",
          k, sqrt(num / den));

    // scatter (assignment) of distinct rows
    for (int i = 0; i < k; i++)
        idx[i] = (int64_t)((i * 7919) % R);
    bool distinct = k <= R;
    emu_launch(grid, 64, [&] { scatter_k(pt, R, pr, pi, k, d, 0); });
    same = distinct;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++)
            same &= table[(size_t)idx[i] * d + j] == rows[(size_t)i * d + j];
    check(same, "scatter %d rows into a %d-row table: exact", k, R);

    // out of range: rows 1 and k-1 bad; the smallest (1) is recorded, its gathered row is NaN
    idx[1] = R;
    idx[k - 1] = -1;
    std::fill(out.begin(), out.end(), 0.0f);
    g_bad_row = ~0ull;
    emu_launch(grid, 64, [&] { gather_k(po, pt, R, pi, k, d); });
    bool nan_row = true;
    for (int j = 0; j < d; j++)
        nan_row &= isnan(out[(size_t)d + j]) && isnan(out[(size_t)(k - 1) * d + j]);
    check(g_bad_row == 1 && nan_row,
          "gather with indices %d and -1 on rows 1 and %d: bad row %llu, rows NaN %d", R, k - 1, g_bad_row,
          nan_row);
    std::vector<float> before = table;
    g_bad_row = ~0ull;
    emu_launch(grid, 64, [&] { scatter_k(pt, R, pr, pi, k, d, 1); });
    bool untouched = true; // the bad rows' sources went nowhere: rows not indexed by a good idx unchanged
    std::vector<char> hit(R, 0);
    for (int i = 0; i < k; i++)
        if (idx[i] >= 0 && idx[i] < R)
            hit[idx[i]] = 1;
    for (int r = 0; r < R; r++)
        if (!hit[r])
            untouched &=
                memcmp(&table[(size_t)r * d], &before[(size_t)r * d], (size_t)d * sizeof(float)) == 0;
    check(g_bad_row == 1 && untouched,
          "scatter-add with the same bad indices: bad row %llu, other rows unchanged %d", g_bad_row,
          untouched);
}

static void unscale_case()
{
    size_t n = 10000 + rnd() % 1000;
    std::vector<float> g(n);
    for (auto &x : g)
        x = frand(-1000, 1000);
    std::vector<float> o = g;
    float *po = o.data();
    unsigned grid = 1 + (unsigned)(rnd() % 4);
    g_found_inf = 0;
    emu_launch(grid, 64, [&] { unscale_check_k(po, n, 0.25f); });
    bool exact = true;
    for (size_t i = 0; i < n; i++)
        exact &= o[i] == g[i] * 0.25f;
    check(g_found_inf == 0 && exact,
          "unscale of %zu finite values by 1/4, grid %u x 64: found_inf %d, exact %d", n, grid, g_found_inf,
          exact);
    for (int kind = 0; kind < 2; kind++) {
        o = g;
        size_t bad = rnd() % n;
        o[bad] = kind ? NAN : INFINITY;
        po = o.data();
        g_found_inf = 0;
        emu_launch(grid, 64, [&] { unscale_check_k(po, n, 0.25f); });
        check(g_found_inf == 1, "unscale with %s at %zu: found_inf %d", kind ? "NaN" : "inf", bad,
              g_found_inf);
    }
}

int main()
{
    uint64_t seed = test_seed();
    printf("seed %llu; head.cu's row / optimizer / unscale kernels emulated on the CPU\n",
           (unsigned long long)seed);
    sgd_case(true);
    sgd_case(false);
    adamw_case();
    rows_case();
    rows_case();
    unscale_case();
    printf("%d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
