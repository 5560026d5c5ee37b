/* Distributed == single process for the head: the Partial FC head with the parameter server.
 *
 * S = 2 real pfcps-server daemons (tests/server/pst.c starts them on 127.0.0.1, tcp provider, BSP,
 * momentum 0.9, weight_decay 5e-4) and W = 1, 2, 3 forked worker processes. Each worker opens a
 * ps_client and a collectives endpoint, joins the rendezvous with the packed two-part address
 * (common/member_addr.h: part 0 PS endpoint, part 1 collectives endpoint), builds the ring
 * (coll_fabric_create) and runs, as worker/train.c does, for 20 steps:
 *     pfc_sample -> ps_pull -> ps_wait -> pfc_step -> ps_push(grad_centers, lr) -> ps_wait
 * with sample_rate 1, global head mode, ArcFace margin (1, 0.5, 0), s = 64, margin_grad exact and
 * straight_through. Every step feeds the same global batch (NB = 12 rows split rank-major among the W
 * workers, D = 16, C = 30; labels and embeddings from a seeded generator written here).
 *
 * Independently, each worker runs a float64 reference written in this file: the initial class centers
 * pulled from the servers before step 0 (the init is the servers' business), then per step a full
 * softmax over all C classes with the margin, the mean cross-entropy, dL/dW and dL/de through the
 * normalisations, and torch.optim.SGD (momentum, weight decay) on every center. Asserted:
 *   - each step's loss equals the reference's (relative <= 1e-4), on every rank;
 *   - each rank's embedding gradients (its B rows of dL/de of the global mean loss) equal the reference
 *     (norm-relative <= 1e-4);
 *   - rank 0 pulls all C centers after step 20 (under BSP: after everybody's 20th push) and they equal
 *     the reference, row by row (norm-relative <= 1e-4);
 *   - with sample_rate 1 a worker's sample is exactly its partition {c : c mod W == rank}.
 * The test would not notice an optimizer that ignores momentum unless that changes the centers by much
 * more than the tolerance: it prints (and asserts > 100x tol) how far a momentum-free reference ends
 * from the real one, and prints the same for weight decay.
 *
 * Math (ArcFace, Deng et al. 2019 eq. 3/4; arcface_torch CombinedMarginLoss, PartialFC_V2):
 *   en = e/|e|, wn = w/|w|, c = en.wn, target v = cos(m1 acos(c) + m2) - m3, else v = c, z = s v,
 *   p = softmax(z), loss = mean_i -log p_i,y_i; dz = (p - onehot)/N; dv/dc = m1 sin(m1 theta + m2) /
 *   sin(theta) (exact) or 1 (straight_through); de = (g - en (en.g))/|e| for g = dL/den, same for w.
 *   SGD: v = mu v + (g + wd w); w -= lr v. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/coll.h"
#include "common/ctl.h"
#include "common/err.h"
#include "common/fabric.h"
#include "common/member_addr.h"
#include "worker/ps_client.h"
#include "tests/server/pst.h"
#include "worker/head/pfc.h"

enum { S_SERVERS = 2, NB = 12, D = 16, C = 30, STEPS = 20, MAXW = 3 };
#define TOL 1e-4
/* The servers' SGD, stated in their config (appended after pst_start's own lines, which say the same). */
#define MOMENTUM     0.9
#define WEIGHT_DECAY 5e-4
#define SERVER_EXTRA "[train]\nmomentum = 0.9\nweight_decay = 0.0005\nmax_staleness = 0\n"
#define SEED         4242u

/* One worker's findings, written into a shared mapping for the parent. */
typedef struct result {
    int done;
    double loss_err, gemb_err, cent_err; /* max relative errors */
    double first_loss, last_loss;
    double sens_mom, sens_wd; /* relative distance of the centers from a reference without momentum / wd */
} result;

/* ---- seeded generator (splitmix64), independent of the code under test ---- */
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s)
{
    return ldexp((double)(splitmix(s) >> 11), -53);
}

static double gauss(uint64_t *s)
{
    double u1 = unif(s), u2 = unif(s);
    return sqrt(-2.0 * log(u1 + 1e-300)) * cos(2.0 * M_PI * u2);
}

/* The global batch of a step: labels (NB) and embeddings (NB x D), the same in every process. Each class
 * has a fixed prototype (its own generator), each row adds its own noise. */
static void make_batch(int step, int64_t *labels, float *emb)
{
    uint64_t s = SEED * 1000003ull + (uint64_t)step;
    for (int i = 0; i < NB; i++)
        labels[i] = (int64_t)(splitmix(&s) % C);
    /* Row i = prototype of its class + noise: learnable, so the loss must fall as the centers train. */
    for (int i = 0; i < NB; i++) {
        uint64_t ps = SEED * 7919ull + (uint64_t)labels[i];
        for (int d = 0; d < D; d++)
            emb[i * D + d] = (float)(gauss(&ps) + 0.5 * gauss(&s));
    }
}

static double lr_of(int step)
{
    static const float lrs[4] = {0.02f, 0.01f, 0.05f, 0.005f};
    return lrs[step % 4];
}

/* ---- float64 reference ---- */

/* Full softmax over all C classes for the global batch; returns the mean loss and writes
 * ge (NB x D) = dL/de and gw (C x D) = dL/dW. */
static double ref_head(const double *E, const int64_t *y, const double *Wt, double s, double m1, double m2,
                       double m3, int exact, double *ge, double *gw)
{
    double en[NB][D], ie[NB], wn[C][D], iw[C], dc[NB][C];
    for (int i = 0; i < NB; i++) {
        double n2 = 0;
        for (int d = 0; d < D; d++)
            n2 += E[i * D + d] * E[i * D + d];
        ie[i] = 1.0 / fmax(sqrt(n2), 1e-12);
        for (int d = 0; d < D; d++)
            en[i][d] = E[i * D + d] * ie[i];
    }
    for (int j = 0; j < C; j++) {
        double n2 = 0;
        for (int d = 0; d < D; d++)
            n2 += Wt[j * D + d] * Wt[j * D + d];
        iw[j] = 1.0 / fmax(sqrt(n2), 1e-12);
        for (int d = 0; d < D; d++)
            wn[j][d] = Wt[j * D + d] * iw[j];
    }
    double loss = 0;
    for (int i = 0; i < NB; i++) {
        double z[C], dvdc[C], mx = -INFINITY;
        for (int j = 0; j < C; j++) {
            double c = 0;
            for (int d = 0; d < D; d++)
                c += en[i][d] * wn[j][d];
            c = fmin(1.0, fmax(-1.0, c));
            double v = c;
            dvdc[j] = 1.0;
            if (j == y[i]) {
                double t = fmin(1.0 - 1e-7, fmax(-1.0 + 1e-7, c));
                double th = acos(t);
                v = cos(m1 * th + m2) - m3;
                if (exact)
                    dvdc[j] = m1 * sin(m1 * th + m2) / sin(th);
            }
            z[j] = s * v;
            mx = fmax(mx, z[j]);
        }
        double sum = 0;
        for (int j = 0; j < C; j++)
            sum += exp(z[j] - mx);
        double li = -(z[y[i]] - mx - log(sum));
        loss += fmin(li, -log(1e-30)); /* arcface_torch's floor of p at 1e-30 */
        for (int j = 0; j < C; j++) {
            double p = exp(z[j] - mx) / sum;
            dc[i][j] = (p - (j == y[i])) / NB * s * dvdc[j];
        }
    }
    for (int i = 0; i < NB; i++) {
        double g[D], dot = 0;
        for (int d = 0; d < D; d++) {
            g[d] = 0;
            for (int j = 0; j < C; j++)
                g[d] += dc[i][j] * wn[j][d];
            dot += g[d] * en[i][d];
        }
        for (int d = 0; d < D; d++)
            ge[i * D + d] = (g[d] - en[i][d] * dot) * ie[i];
    }
    for (int j = 0; j < C; j++) {
        double g[D], dot = 0;
        for (int d = 0; d < D; d++) {
            g[d] = 0;
            for (int i = 0; i < NB; i++)
                g[d] += dc[i][j] * en[i][d];
            dot += g[d] * wn[j][d];
        }
        for (int d = 0; d < D; d++)
            gw[j * D + d] = (g[d] - wn[j][d] * dot) * iw[j];
    }
    return loss / NB;
}

/* torch.optim.SGD, dampening 0, no Nesterov, buffer starting at 0 (same as PyTorch's buf = d first). */
static void ref_sgd(double *w, double *v, const double *g, size_t n, double lr, double mu, double wd)
{
    for (size_t i = 0; i < n; i++) {
        v[i] = mu * v[i] + (g[i] + wd * w[i]);
        w[i] -= lr * v[i];
    }
}

/* Max over rows of |a_r - b_r| / |b_r| (rows of `cols` values). */
static double row_rel(const float *a, const double *b, int rows, int cols)
{
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double num = 0, den = 0;
        for (int c = 0; c < cols; c++) {
            double e = (double)a[r * cols + c] - b[r * cols + c];
            num += e * e;
            den += b[r * cols + c] * b[r * cols + c];
        }
        worst = fmax(worst, sqrt(num) / fmax(sqrt(den), 1e-300));
    }
    return worst;
}

static double rel_dd(const double *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num) / fmax(sqrt(den), 1e-300);
}

/* ---- worker process ---- */

typedef struct job {
    pst_cluster *cl;
    const char *secret;
    int W, rank;
    head_margin_grad mg;
    result *res;
} job;

static int pull_all(ps_client *ps, int64_t step, float *out)
{
    int64_t ids[C];
    for (int c = 0; c < C; c++)
        ids[c] = c;
    ps_req *rq;
    int rc = ps_pull(ps, ids, C, out, step, &rq);
    if (rc == 0)
        rc = ps_wait(ps, rq, 30.0);
    return rc;
}

static int worker(job *j)
{
    const int W = j->W, rank = j->rank, B = NB / W;
    const char *what = "setup";
    ps_client *ps = NULL;
    fab_ctx *fab = NULL;
    ctl_session *sess = NULL;
    pf_coll coll;
    int have_coll = 0, have_pfc = 0, fails = 0;
    pfc x;
    result *R = j->res;
    float cen[C * D], gcen[C * D], gemb[NB * D], emb[NB * D], pulled[C * D];
    int64_t labels[NB];
    double Wr[C * D], Vr[C * D], Wm[C * D], Vm[C * D], Ww[C * D], Vw[C * D], E[NB * D], ge[NB * D],
        ge2[NB * D], gw[C * D];

    ps_client_opts po = {.provider = "tcp",
                         .rank = rank,
                         .servers = S_SERVERS,
                         .num_classes = C,
                         .dim = D,
                         .dtype = PS_DT_FP32};
    int rc = ps_client_create(&po, &ps);
    if (rc == 0)
        rc = fab_open("tcp", &fab);
    uint8_t a0[FAB_MAX_ADDR], a1[FAB_MAX_ADDR], packed[CTL_MAX_ADDR];
    size_t l0 = sizeof a0, l1 = sizeof a1;
    if (rc == 0)
        rc = ps_client_getname(ps, a0, &l0);
    if (rc == 0)
        rc = fab_getname(fab, a1, &l1);
    int plen = -1;
    if (rc == 0) {
        const void *parts[2] = {a0, a1};
        size_t lens[2] = {l0, l1};
        plen = member_addr_pack(packed, sizeof packed, 2, parts, lens);
        rc = plen < 0 ? plen : 0;
    }
    if (rc == 0) {
        what = "join";
        rc = ctl_join("127.0.0.1", j->cl->port, CTL_ROLE_WORKER, rank, packed, (size_t)plen, j->secret,
                      1 << 20, 30.0, &sess);
    }
    const ctl_book *book = rc == 0 ? ctl_session_book(sess) : NULL;
    uint64_t token = 0;
    if (rc == 0 && (rc = ctl_data_token(j->secret, book->run_nonce, &token)) == 0)
        ps_client_set_token(ps, token);
    for (int s = 0; rc == 0 && s < S_SERVERS; s++)
        rc = ps_client_add_server(ps, s, book->servers[s].addr, book->servers[s].addr_len);
    if (rc == 0) {
        what = "warmup";
        rc = ps_client_warmup(ps, 30.0);
    }
    if (rc == 0) {
        what = "ring";
        const void *addrs[MAXW];
        size_t lens[MAXW];
        for (int w = 0; w < W && rc == 0; w++)
            rc = member_addr_part(book->workers[w].addr, book->workers[w].addr_len, 1, &addrs[w], &lens[w]);
        coll_fabric_opts co = {.timeout_s = 30};
        if (rc == 0)
            rc = coll_fabric_create(fab, rank, W, addrs, lens, &co, &coll);
        have_coll = rc == 0;
    }
    head_params hp = {.s = 64,
                      .m1 = 1,
                      .m2 = 0.5,
                      .m3 = 0,
                      .margin_grad = j->mg,
                      .mode = HEAD_MODE_GLOBAL,
                      .clamp_loss = 1};
    if (rc == 0) {
        what = "pfc_init";
        rc = pfc_init(&x, &hp, &coll, C, 1.0, SEED, B, D);
        have_pfc = rc == 0;
    }
    /* The servers' initial centers, before any push. */
    if (rc == 0) {
        what = "initial pull";
        rc = pull_all(ps, 0, pulled);
    }
    if (rc == 0) {
        for (int i = 0; i < C * D; i++)
            Wr[i] = Wm[i] = Ww[i] = pulled[i], Vr[i] = Vm[i] = Vw[i] = 0;
        double n0 = 0;
        for (int i = 0; i < C * D; i++)
            n0 += Wr[i] * Wr[i];
        if (!(n0 > 0)) {
            printf("FAIL W=%d rank %d: the servers' initial centers are all zero\n", W, rank);
            fails++;
        }
    }
    const int exact = j->mg == HEAD_MARGIN_GRAD_EXACT;
    for (int step = 0; rc == 0 && step < STEPS; step++) {
        make_batch(step, labels, emb);
        const double lr = lr_of(step);
        const int64_t *ids;
        int64_t k;
        ps_req *rq;
        double loss = NAN;
        what = "pfc_sample";
        rc = pfc_sample(&x, step, labels + rank * B, &ids, &k);
        if (rc == 0) {
            /* sample_rate 1: exactly my partition, sorted. */
            int64_t want = 0;
            for (int c = rank; c < C; c += W) {
                if (want >= k || ids[want] != c)
                    break;
                want++;
            }
            if (want != k || k != (C - rank + W - 1) / W) {
                printf(
                    "FAIL W=%d rank %d step %d: sample of %lld ids is not the partition {c mod %d == %d}\n",
                    W, rank, step, (long long)k, W, rank);
                fails++;
            }
            what = "pull";
            rc = ps_pull(ps, ids, (size_t)k, cen, step, &rq);
        }
        if (rc == 0)
            rc = ps_wait(ps, rq, 30.0);
        if (rc == 0) {
            what = "pfc_step";
            rc = pfc_step(&x, emb + (size_t)rank * B * D, cen, &loss, gemb, gcen);
        }
        if (rc == 0) {
            what = "push";
            rc = ps_push(ps, ids, (size_t)k, gcen, (float)lr, step, &rq);
        }
        if (rc == 0)
            rc = ps_wait(ps, rq, 30.0);
        if (rc < 0)
            break;

        /* Reference step at the centers before this step's update, then SGD; the two sensitivity
         * references (no momentum, no weight decay) follow their own trajectories. */
        for (int i = 0; i < NB * D; i++)
            E[i] = emb[i];
        double lref = ref_head(E, labels, Wr, 64, 1, 0.5, 0, exact, ge, gw);
        ref_sgd(Wr, Vr, gw, C * D, lr, MOMENTUM, WEIGHT_DECAY);
        ref_head(E, labels, Wm, 64, 1, 0.5, 0, exact, ge2, gw);
        ref_sgd(Wm, Vm, gw, C * D, lr, 0.0, WEIGHT_DECAY);
        ref_head(E, labels, Ww, 64, 1, 0.5, 0, exact, ge2, gw);
        ref_sgd(Ww, Vw, gw, C * D, lr, MOMENTUM, 0.0);
        double gerr = row_rel(gemb, ge + (size_t)rank * B * D, 1, B * D);
        R->gemb_err = fmax(R->gemb_err, gerr);
        if (!(gerr <= TOL)) {
            printf("FAIL W=%d rank %d step %d: embedding gradients differ from the reference (rel %.3g)\n", W,
                   rank, step, gerr);
            fails++;
        }
        double le = fabs(loss - lref) / fabs(lref);
        R->loss_err = fmax(R->loss_err, le);
        if (step == 0)
            R->first_loss = lref;
        R->last_loss = lref;
        if (!(le <= TOL)) {
            printf("FAIL W=%d rank %d step %d: loss %.9g, reference %.9g (rel %.3g)\n", W, rank, step, loss,
                   lref, le);
            fails++;
        }
    }
    if (rc < 0) {
        printf("FAIL W=%d rank %d %s: %s\n", W, rank, what, pf_errmsg());
        fails++;
    }
    if (rc == 0 && rank == 0) {
        rc = pull_all(ps, STEPS, pulled);
        if (rc < 0) {
            printf("FAIL W=%d rank 0 final pull: %s\n", W, pf_errmsg());
            fails++;
        } else {
            R->cent_err = row_rel(pulled, Wr, C, D);
            R->sens_mom = rel_dd(Wm, Wr, C * D);
            R->sens_wd = rel_dd(Ww, Wr, C * D);
            if (!(R->cent_err <= TOL)) {
                printf("FAIL W=%d: centers after %d steps differ from the reference (row rel %.3g)\n", W,
                       STEPS, R->cent_err);
                fails++;
            }
            if (!(R->sens_mom > 100 * TOL)) {
                printf("FAIL W=%d: a momentum-free reference ends only %.3g away: the check cannot tell\n", W,
                       R->sens_mom);
                fails++;
            }
        }
    }
    /* End with a barrier: a rank must not close its endpoint while a peer may still send. */
    if (have_coll && rc == 0 && coll_barrier(&coll) < 0) {
        printf("FAIL W=%d rank %d closing barrier: %s\n", W, rank, pf_errmsg());
        fails++;
    }
    if (have_pfc)
        pfc_free(&x);
    if (have_coll)
        coll_destroy(&coll);
    fab_close(fab);
    ps_client_destroy(ps);
    if (sess)
        ctl_session_close(sess);
    R->done = 1;
    fflush(stdout);
    return fails ? 1 : 0;
}

/* ---- parent: servers, forked workers, summary ---- */

/* The join secret pst_start wrote into the servers' config. */
static int read_secret(const char *cfg_path, char *out, size_t cap)
{
    FILE *f = fopen(cfg_path, "r");
    if (!f)
        return -1;
    char line[512];
    int found = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, " secret = %255s", out) == 1 && strlen(out) < cap)
            found = 0;
    fclose(f);
    return found;
}

static int run_case(int W, head_margin_grad mg, double *worst)
{
    const char *mgname = mg == HEAD_MARGIN_GRAD_EXACT ? "exact" : "straight_through";
    pst_cluster cl;
    int rc = pst_start(&cl, S_SERVERS, W, C, D, SERVER_EXTRA, 240);
    if (rc == 77)
        return 77;
    if (rc != 0)
        return 1;
    char secret[256];
    if (read_secret(cl.cfg_path, secret, sizeof secret) < 0) {
        printf("FAIL: no secret in %s\n", cl.cfg_path);
        pst_stop(&cl);
        return 1;
    }
    result *res =
        mmap(NULL, sizeof(result) * MAXW, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) {
        pst_stop(&cl);
        return 1;
    }
    memset(res, 0, sizeof(result) * MAXW);
    pid_t pids[MAXW] = {0};
    fflush(stdout);
    for (int r = 0; r < W; r++) {
        pid_t p = fork();
        if (p < 0) {
            printf("FAIL: fork: %s\n", strerror(errno));
            break;
        }
        if (p == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* die with the test */
            alarm(90);                        /* and on our own if stuck */
            job j = {.cl = &cl, .secret = secret, .W = W, .rank = r, .mg = mg, .res = &res[r]};
            int code = worker(&j);
            fflush(stdout);
            _exit(code);
        }
        pids[r] = p;
    }
    int fail = 0;
    double t0 = pst_now();
    for (int r = 0; r < W; r++) {
        if (pids[r] <= 0) {
            fail = 1;
            continue;
        }
        int st = 0;
        pid_t got = 0;
        while ((got = waitpid(pids[r], &st, WNOHANG)) == 0 && pst_now() - t0 < 80)
            usleep(10000);
        if (got == 0) {
            printf("FAIL W=%d %s: worker %d did not finish in 80 s (killed)\n", W, mgname, r);
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &st, 0);
            fail = 1;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("FAIL W=%d %s: worker %d exit status %d (signal %d)\n", W, mgname, r,
                   WIFEXITED(st) ? WEXITSTATUS(st) : -1, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            fail = 1;
        }
    }
    if (fail)
        pst_dump_logs(&cl);
    if (pst_stop(&cl) != 0)
        fail = 1;
    double le = 0, ge = 0;
    for (int r = 0; r < W; r++)
        le = fmax(le, res[r].loss_err), ge = fmax(ge, res[r].gemb_err);
    printf("%s W=%d S=%d margin_grad=%-16s loss %.5f -> %.5f over %d steps | max rel err: loss %.2e, "
           "grad_embeddings %.2e, centers %.2e (tol %.0e) | centers without momentum differ by %.2e, without "
           "weight decay by %.2e\n",
           fail ? "FAIL" : "ok  ", W, S_SERVERS, mgname, res[0].first_loss, res[0].last_loss, STEPS, le, ge,
           res[0].cent_err, TOL, res[0].sens_mom, res[0].sens_wd);
    worst[0] = fmax(worst[0], le);
    worst[1] = fmax(worst[1], ge);
    worst[2] = fmax(worst[2], res[0].cent_err);
    if (!fail && !(res[0].last_loss < res[0].first_loss)) {
        printf("FAIL W=%d %s: the loss did not fall (%.5f -> %.5f): the run does not train\n", W, mgname,
               res[0].first_loss, res[0].last_loss);
        fail = 1;
    }
    munmap(res, sizeof(result) * MAXW);
    return fail;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int fails = 0;
    double worst[3] = {0, 0, 0};
    const head_margin_grad modes[2] = {HEAD_MARGIN_GRAD_EXACT, HEAD_MARGIN_GRAD_STRAIGHT_THROUGH};
    for (int m = 0; m < 2; m++)
        for (int W = 1; W <= MAXW; W++) {
            int rc = run_case(W, modes[m], worst);
            if (rc == 77)
                return 77;
            fails += rc != 0;
        }
    printf("%s: head + %d parameter servers over W = 1..%d workers vs float64 full softmax + SGD, %d steps: "
           "max rel "
           "err loss %.2e, grad_embeddings %.2e, centers %.2e (tol %.0e)\n",
           fails ? "FAIL" : "PASS", S_SERVERS, MAXW, STEPS, worst[0], worst[1], worst[2], TOL);
    return fails ? 1 : 0;
}
