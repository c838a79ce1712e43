/* lloyd_max.c - kvq_codebook_compute: the Lloyd-Max quantizer of one rotated
 * coordinate, solved by Newton's method on the Lloyd conditions.
 *
 * Densities (unnormalised; only ratios matter until the mse is normalised):
 *   beta:  g(t) = (1 - t^2)^a on [-1, 1], a = (d - 3)/2,  Z = B(1/2, a + 1)
 *   gauss: g(x) = exp(-x^2/2) in standard units x = t sqrt(d),  Z = sqrt(2 pi)
 * The Gaussian codebook is solved once in standard units (it does not depend
 * on d) and scaled by 1/sqrt(d); its mse per unit vector is the standard
 * per-coordinate mse (d * sigma^2 with sigma^2 = 1/d).
 *
 * Cell integrals (cell [l, r], everything in long double):
 *   numerator  N = int t g: closed forms, written so narrow cells do not
 *              cancel: (P(l) - P(r)) = -P(l) expm1(k log1p((l^2 - r^2)/(1 - l^2)))
 *              with P = (1 - t^2)^k, k = a + 1, and exp(-l^2/2) - exp(-r^2/2)
 *              = -exp(-l^2/2) expm1((l - r)(l + r)/2) (roles swapped when |l| > |r|).
 *   mass       M = int g: gauss from erfc differences of same-sign arguments
 *              (erf sum across 0), so tail cells keep full relative accuracy;
 *              beta by adaptive 20-point Gauss-Legendre (quadrature.c). For
 *              |t| <= 1/2 the integrand (1 - t^2)^a is analytic with its
 *              singularities at +-1 far away; for |t| > 1/2 we substitute
 *              t = 1 - s^2, which turns it into 2 s^(d-2) (2 - s^2)^a, analytic
 *              on the whole piece even at s = 0 (d - 2 is an integer), so
 *              Gauss-Legendre converges geometrically also for d = 4, 5 where
 *              (1 - t^2)^a has a square-root type endpoint.
 *   mse        sum over cells of int (t - c)^2 g, integrated directly the same
 *              way (never as E[t^2] - M c^2, which cancels in narrow cells).
 * Requested quadrature accuracy is 1e-16 relative, so centroids (N / M) are
 * good to ~1e-17 and the iteration below can meet its 1e-12 stopping rule
 * with orders of magnitude to spare.
 *
 * Iteration: unknowns are the centroids c_0 < ... < c_{n-1}; boundaries are
 * their midpoints; the residual is F_i = c_i - m_i, m_i the conditional mean
 * of cell i. Plain Lloyd (c <- m) converges linearly with a rate that tends
 * to 1 as n grows (from the start below, d = 128: 50 sweeps for 2 bits, 622
 * for 4, 7621 for 6, i.e. seconds, and far more for 8), so we take Newton steps:
 * dm_i/dl = g(l)(m_i - l)/M_i and dm_i/dr = g(r)(r - m_i)/M_i make the
 * Jacobian tridiagonal (O(n) Thomas solve). Steps are halved until the
 * residual drops and the centroids stay ordered; when that fails a Lloyd
 * step is taken instead, which never increases the distortion. The start is
 * the high-resolution (companding) solution: centroids at the quantiles
 * (i + 1/2)/n of g^(1/3), which is already close for large n. Symmetry about
 * 0 is imposed after every step. Stop when no centroid moves more than 1e-13
 * (working units) and confirm max |c_i - m_i| <= 1e-12 at the end.
 * Measured: 1-6 iterations for all d in 3..300 and log-spaced d up to 65536,
 * b = 1..8; a few ms for b <= 4, 20-60 ms for b = 8 (mostly beta quadrature).
 */
#include "codebook_internal.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define GAUSS_CUT 40.0L    /* standard units; exp(-800) is nothing next to 1e-19 */
#define QUAD_REL_TOL 1e-16L
#define STEP_TOL 1e-13L
#define RESID_TOL 1e-12L
#define MAX_ITER 400
#define INIT_PANELS 8192

struct density {
    enum kvq_dist dist;
    int dim;
    long double alpha; /* beta exponent (d - 3)/2 */
    long double lo, hi;
    long double log_z; /* log of the integral of g over the support */
};

struct sq_ctx {
    const struct density *ds;
    long double c;
};

/* g(t) of the beta density; alpha = 0 (d = 3) is the uniform density. */
static long double beta_g(long double t, long double alpha)
{
    if (alpha == 0.0L)
        return 1.0L;
    return expl(alpha * log1pl(-t * t));
}

static long double dens_g(const struct density *ds, long double t)
{
    if (ds->dist == KVQ_DIST_GAUSS)
        return expl(-0.5L * t * t);
    return beta_g(t, ds->alpha);
}

/* Integrands. t-form for |t| <= 1/2; s-form (t = 1 - s^2, dt = -2s ds) above. */
static long double f_mass_t(long double t, const void *ctx)
{
    const struct density *ds = ctx;
    return beta_g(t, ds->alpha);
}

static long double s_jacobian_g(long double s, const struct density *ds)
{
    if (s <= 0.0L)
        return 0.0L;
    return 2.0L * expl((long double)(ds->dim - 2) * logl(s) + ds->alpha * logl(2.0L - s * s));
}

static long double f_mass_s(long double s, const void *ctx)
{
    return s_jacobian_g(s, ctx);
}

static long double f_sq_t(long double t, const void *ctx)
{
    const struct sq_ctx *q = ctx;
    long double e = t - q->c;
    return e * e * dens_g(q->ds, t);
}

static long double f_sq_s(long double s, const void *ctx)
{
    const struct sq_ctx *q = ctx;
    long double e = (1.0L - q->c) - s * s; /* t - c without forming t */
    return e * e * s_jacobian_g(s, q->ds);
}

/* int over [l, r] (0 <= l < r <= 1) of w(t) g(t) for the beta density, where
 * w = 1 (sq == NULL) or (t - sq->c)^2. */
static long double beta_pos_integral(const struct density *ds, const struct sq_ctx *sq,
                                     long double l, long double r, int *ok)
{
    long double sum = 0.0L;
    if (l < 0.5L) {
        long double top = r < 0.5L ? r : 0.5L;
        sum += sq ? kvq_cb_integrate(f_sq_t, sq, l, top, QUAD_REL_TOL, ok)
                  : kvq_cb_integrate(f_mass_t, ds, l, top, QUAD_REL_TOL, ok);
    }
    if (r > 0.5L) {
        long double bot = l > 0.5L ? l : 0.5L;
        long double s_lo = sqrtl(1.0L - r), s_hi = sqrtl(1.0L - bot);
        sum += sq ? kvq_cb_integrate(f_sq_s, sq, s_lo, s_hi, QUAD_REL_TOL, ok)
                  : kvq_cb_integrate(f_mass_s, ds, s_lo, s_hi, QUAD_REL_TOL, ok);
    }
    return sum;
}

/* Same over any [l, r] in [-1, 1]: the negative part is mirrored (t -> -t,
 * which also mirrors the centroid of the squared error). */
static long double beta_integral(const struct density *ds, long double c, int sq,
                                 long double l, long double r, int *ok)
{
    long double sum = 0.0L;
    if (l < 0.0L) {
        struct sq_ctx m = {ds, -c};
        long double top = r < 0.0L ? r : 0.0L;
        sum += beta_pos_integral(ds, sq ? &m : NULL, -top, -l, ok);
    }
    if (r > 0.0L) {
        struct sq_ctx p = {ds, c};
        long double bot = l > 0.0L ? l : 0.0L;
        sum += beta_pos_integral(ds, sq ? &p : NULL, bot, r, ok);
    }
    return sum;
}

static long double cell_mass(const struct density *ds, long double l, long double r, int *ok)
{
    if (ds->dist == KVQ_DIST_GAUSS) {
        const long double k = 0.70710678118654752440084436210484903928L; /* 1/sqrt(2) */
        const long double c = 1.25331413731550025120788264240552262881L; /* sqrt(pi/2) */
        if (l >= 0.0L)
            return c * (erfcl(l * k) - erfcl(r * k));
        if (r <= 0.0L)
            return c * (erfcl(-r * k) - erfcl(-l * k));
        return c * (erfl(r * k) + erfl(-l * k));
    }
    return beta_integral(ds, 0.0L, 0, l, r, ok);
}

/* int over [l, r] of t g(t), closed forms (see the top of the file). */
static long double cell_numerator(const struct density *ds, long double l, long double r)
{
    if (fabsl(l) == fabsl(r))
        return 0.0L;
    long double prod = (l - r) * (l + r); /* l^2 - r^2, exact-ish for close l, r */
    if (ds->dist == KVQ_DIST_GAUSS) {
        if (fabsl(l) < fabsl(r))
            return -expl(-0.5L * l * l) * expm1l(0.5L * prod);
        return expl(-0.5L * r * r) * expm1l(-0.5L * prod);
    }
    /* The ratio P(far)/P(near) = (1 + q)^k with q >= -1; rounding can push q
     * just below -1 when the far end is +-1 (where P = 0), hence the clamp. */
    long double k = ds->alpha + 1.0L, diff;
    if (fabsl(l) < fabsl(r)) {
        long double q = fmaxl(prod / (1.0L - l * l), -1.0L);
        diff = -expl(k * log1pl(-l * l)) * expm1l(k * log1pl(q));
    } else {
        long double q = fmaxl(-prod / (1.0L - r * r), -1.0L);
        diff = expl(k * log1pl(-r * r)) * expm1l(k * log1pl(q));
    }
    return diff / (2.0L * k);
}

static long double cell_sqerr(const struct density *ds, long double l, long double r,
                              long double c, int *ok)
{
    if (ds->dist == KVQ_DIST_GAUSS) {
        struct sq_ctx q = {ds, c};
        return kvq_cb_integrate(f_sq_t, &q, l, r, QUAD_REL_TOL, ok);
    }
    return beta_integral(ds, c, 1, l, r, ok);
}

/* Cell i spans [bound(i-1), bound(i)] with the support ends outside. */
static long double bound(const struct density *ds, const long double *c, int n, int i)
{
    if (i < 0)
        return ds->lo;
    if (i >= n - 1)
        return ds->hi;
    return 0.5L * (c[i] + c[i + 1]);
}

/* Conditional means m and masses M of every cell for centroids c.
 * @return max |c_i - m_i|, or -1 when a cell is empty or not finite. */
static long double lloyd_map(const struct density *ds, const long double *c, int n,
                             long double *m, long double *mass, int *ok)
{
    long double worst = 0.0L;
    for (int i = 0; i < n; i++) {
        long double l = bound(ds, c, n, i - 1), r = bound(ds, c, n, i);
        long double mi = cell_mass(ds, l, r, ok);
        if (!(mi > 0.0L) || !isfinite(mi))
            return -1.0L;
        mass[i] = mi;
        m[i] = cell_numerator(ds, l, r) / mi;
        long double e = fabsl(c[i] - m[i]);
        if (!(e <= worst))
            worst = e; /* also catches NaN */
    }
    return isfinite(worst) ? worst : -1.0L;
}

static void symmetrize(long double *c, int n)
{
    for (int i = 0; i < n / 2; i++) {
        long double v = 0.5L * (c[n - 1 - i] - c[i]);
        c[i] = -v;
        c[n - 1 - i] = v;
    }
}

static int admissible(const struct density *ds, const long double *c, int n)
{
    if (!(c[0] > ds->lo) || !(c[n - 1] < ds->hi))
        return 0;
    for (int i = 1; i < n; i++)
        if (!(c[i] > c[i - 1]))
            return 0;
    return 1;
}

/* Companding start: quantiles (i + 1/2)/n of g^(1/3), trapezoid sums on a
 * uniform grid, one sweep (no buffer, so no large stack frame). */
static void init_companding(const struct density *ds, long double *c, int n)
{
    long double lo = ds->dist == KVQ_DIST_GAUSS ? -14.0L : -1.0L, hi = -lo;
    long double h = (hi - lo) / INIT_PANELS, total = 0.0L;
    long double prev = cbrtl(dens_g(ds, lo));
    for (int k = 1; k <= INIT_PANELS; k++) {
        long double cur = cbrtl(dens_g(ds, lo + h * k));
        total += 0.5L * h * (prev + cur);
        prev = cur;
    }
    long double acc = 0.0L;
    int i = 0;
    prev = cbrtl(dens_g(ds, lo));
    for (int k = 1; k <= INIT_PANELS && i < n; k++) {
        long double cur = cbrtl(dens_g(ds, lo + h * k));
        long double piece = 0.5L * h * (prev + cur);
        while (i < n && acc + piece >= total * ((long double)i + 0.5L) / n) {
            long double frac = (total * ((long double)i + 0.5L) / n - acc) / piece;
            c[i++] = lo + h * ((long double)(k - 1) + frac);
        }
        acc += piece;
        prev = cur;
    }
    for (; i < n; i++) /* round-off at the very end of the sweep */
        c[i] = hi - h * 0.5L;
    symmetrize(c, n);
}

/* Newton step: solve J delta = c - m with J tridiagonal (see top of file).
 * @return 0, or -1 if the system is singular. */
static int newton_direction(const struct density *ds, const long double *c, const long double *m,
                            const long double *mass, int n, long double *delta, long double *cp)
{
    long double prev_sup = 0.0L, prev_dp = 0.0L;
    for (int i = 0; i < n; i++) {
        long double dl = 0.0L, dr = 0.0L;
        if (i > 0) {
            long double l = bound(ds, c, n, i - 1);
            dl = dens_g(ds, l) * (m[i] - l) / mass[i];
        }
        if (i < n - 1) {
            long double r = bound(ds, c, n, i);
            dr = dens_g(ds, r) * (r - m[i]) / mass[i];
        }
        long double sub = -0.5L * dl, diag = 1.0L - 0.5L * (dl + dr), sup = -0.5L * dr;
        long double den = diag - (i > 0 ? sub * prev_sup : 0.0L);
        if (!(fabsl(den) > 0.0L) || !isfinite(den))
            return -1;
        cp[i] = sup / den;
        delta[i] = ((c[i] - m[i]) - (i > 0 ? sub * prev_dp : 0.0L)) / den;
        prev_sup = cp[i];
        prev_dp = delta[i];
    }
    for (int i = n - 2; i >= 0; i--)
        delta[i] -= cp[i] * delta[i + 1];
    for (int i = 0; i < n; i++)
        if (!isfinite(delta[i]))
            return -1;
    return 0;
}

static kvq_status solve(const struct density *ds, int n, long double *c, int *iterations, int *ok)
{
    long double m[KVQ_CODEBOOK_MAX_LEVELS], mass[KVQ_CODEBOOK_MAX_LEVELS];
    long double delta[KVQ_CODEBOOK_MAX_LEVELS], work[KVQ_CODEBOOK_MAX_LEVELS];
    long double trial[KVQ_CODEBOOK_MAX_LEVELS];
    long double tm[KVQ_CODEBOOK_MAX_LEVELS], tmass[KVQ_CODEBOOK_MAX_LEVELS];

    init_companding(ds, c, n);
    long double res = lloyd_map(ds, c, n, m, mass, ok);
    if (res < 0.0L)
        return KVQ_ERR_INTERNAL;
    for (int it = 1; it <= MAX_ITER; it++) {
        long double step = 0.0L;
        int moved = 0;
        if (newton_direction(ds, c, m, mass, n, delta, work) == 0) {
            long double dmax = 0.0L;
            for (int i = 0; i < n; i++)
                dmax = fmaxl(dmax, fabsl(delta[i]));
            for (long double lambda = 1.0L; lambda > 1e-6L && !moved; lambda *= 0.5L) {
                for (int i = 0; i < n; i++)
                    trial[i] = c[i] - lambda * delta[i];
                symmetrize(trial, n);
                if (!admissible(ds, trial, n))
                    continue;
                long double tres = lloyd_map(ds, trial, n, tm, tmass, ok);
                /* At the round-off floor the residual cannot drop any more;
                 * a step that small is accepted as it is. */
                if (tres >= 0.0L && (tres < res || dmax * lambda <= STEP_TOL)) {
                    for (int i = 0; i < n; i++) {
                        step = fmaxl(step, fabsl(trial[i] - c[i]));
                        c[i] = trial[i];
                        m[i] = tm[i];
                        mass[i] = tmass[i];
                    }
                    res = tres;
                    moved = 1;
                }
            }
        }
        if (!moved) { /* Lloyd step: c <- m, always admissible */
            for (int i = 0; i < n; i++) {
                step = fmaxl(step, fabsl(m[i] - c[i]));
                c[i] = m[i];
            }
            symmetrize(c, n);
            res = lloyd_map(ds, c, n, m, mass, ok);
            if (res < 0.0L)
                return KVQ_ERR_INTERNAL;
        }
        if (step <= STEP_TOL) {
            *iterations = it;
            return res <= RESID_TOL ? KVQ_OK : KVQ_ERR_NOT_CONVERGED;
        }
    }
    *iterations = MAX_ITER;
    return KVQ_ERR_NOT_CONVERGED;
}

static long double log_beta_half(long double k)
{
    int sign;
    return lgammal_r(0.5L, &sign) + lgammal_r(k, &sign) - lgammal_r(k + 0.5L, &sign);
}

kvq_status kvq_codebook_compute(int dim, int bits, enum kvq_dist dist, kvq_codebook *out)
{
    if (!out)
        return KVQ_ERR_INVALID_ARG;
    if (dist != KVQ_DIST_BETA && dist != KVQ_DIST_GAUSS)
        return KVQ_ERR_INVALID_ARG;
    if (dim < KVQ_CODEBOOK_MIN_DIM || dim > KVQ_CODEBOOK_MAX_DIM || bits < 1 ||
        bits > KVQ_CODEBOOK_MAX_BITS)
        return KVQ_ERR_UNSUPPORTED;

    struct density ds = {.dist = dist, .dim = dim};
    if (dist == KVQ_DIST_GAUSS) {
        ds.lo = -GAUSS_CUT;
        ds.hi = GAUSS_CUT;
        ds.log_z = 0.5L * logl(2.0L * 3.14159265358979323846264338327950288L);
    } else {
        ds.alpha = 0.5L * (long double)(dim - 3);
        ds.lo = -1.0L;
        ds.hi = 1.0L;
        ds.log_z = log_beta_half(ds.alpha + 1.0L);
    }

    int n = 1 << bits, ok = 1, iterations = 0;
    long double c[KVQ_CODEBOOK_MAX_LEVELS];
    kvq_status st = solve(&ds, n, c, &iterations, &ok);
    if (st != KVQ_OK)
        return st;

    /* The published codebook: centroids rounded to double, boundaries the
     * midpoints of those doubles, mse integrated for exactly that codebook.
     * Built in a zeroed local (padding included, so results compare with
     * memcmp) and copied out only on success. */
    long double scale = dist == KVQ_DIST_GAUSS ? 1.0L / sqrtl((long double)dim) : 1.0L;
    kvq_codebook r;
    memset(&r, 0, sizeof r);
    r.dim = dim;
    r.bits = bits;
    r.dist = dist;
    r.levels = n;
    r.iterations = iterations;
    for (int i = 0; i < n; i++)
        r.centroids[i] = (double)(c[i] * scale);
    for (int i = 0; i < n - 1; i++)
        r.boundaries[i] =
            (double)(0.5L * ((long double)r.centroids[i] + (long double)r.centroids[i + 1]));

    long double sq = 0.0L;
    for (int i = 0; i < n; i++) {
        long double lo = i > 0 ? (long double)r.boundaries[i - 1] / scale : ds.lo;
        long double hi = i < n - 1 ? (long double)r.boundaries[i] / scale : ds.hi;
        sq += cell_sqerr(&ds, lo, hi, (long double)r.centroids[i] / scale, &ok);
    }
    long double per_coord = expl(logl(sq) - ds.log_z);
    r.mse = (double)(dist == KVQ_DIST_GAUSS ? per_coord : per_coord * (long double)dim);
    if (!ok)
        return KVQ_ERR_NOT_CONVERGED;
    memcpy(out, &r, sizeof r);
    return KVQ_OK;
}
