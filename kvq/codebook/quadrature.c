/* quadrature.c - adaptive Gauss-Legendre quadrature in long double.
 *
 * Every integrand the codebook module integrates is analytic on the closed
 * interval it is integrated over (lloyd_max.c arranges that with a change of
 * variable near the endpoints +-1 of the beta density), so a fixed high-order
 * Gauss rule converges geometrically and simple bisection is enough for the
 * rare piece that is too wide (Gaussian-like peaks at large d, the outermost
 * cell). Long double (x87, 64-bit mantissa) keeps the round-off of sums of
 * ~10^3 terms near 1e-18, far below the 1e-12 the Lloyd iteration aims at.
 */
#include "codebook_internal.h"

#include <math.h>

/* Positive nodes and weights of the 20-point Gauss-Legendre rule on [-1, 1]
 * (the rule is symmetric). Computed to 30 digits with mpmath by Newton's
 * method on P_20; tests/test_codebook.c checks that the rule integrates
 * polynomials of degree 39 exactly. */
static const long double gl20[10][2] = {
    {0.993128599185094924786122388471L, 0.0176140071391521183118619623519L},
    {0.963971927277913791267666131197L, 0.0406014298003869413310399522749L},
    {0.912234428251325905867752441203L, 0.062672048334109063569506535187L},
    {0.839116971822218823394529061702L, 0.083276741576704748724758143222L},
    {0.746331906460150792614305070356L, 0.10193011981724043503675013548L},
    {0.636053680726515025452836696226L, 0.118194531961518417312377377711L},
    {0.510867001950827098004364050955L, 0.131688638449176626898494499748L},
    {0.373706088715419560672548177025L, 0.142096109318382051329298325067L},
    {0.227785851141645078080496195369L, 0.149172986472603746787828737002L},
    {0.0765265211334973337546404093988L, 0.152753387130725850698084331955L},
};

static long double gl20_rule(kvq_cb_integrand fn, const void *ctx, long double a, long double b)
{
    long double half = 0.5L * (b - a), mid = 0.5L * (a + b), s = 0.0L;
    for (int i = 0; i < 10; i++) {
        long double dx = half * gl20[i][0];
        s += gl20[i][1] * (fn(mid - dx, ctx) + fn(mid + dx, ctx));
    }
    return s * half;
}

/* Safety nets that normal integrals never reach (tests check that the
 * codebooks converge without hitting them): depth and a cap on pieces. */
#define MAX_PIECES 100000
/* A piece is also accepted when accurate relative to itself, see below. */
#define LOCAL_REL_TOL 1e-12L

struct quad_state {
    kvq_cb_integrand fn;
    const void *ctx;
    long double tol;
    int pieces;
    int ok;
};

static long double adapt(struct quad_state *q, long double a, long double b, long double whole,
                         int depth)
{
    long double mid = 0.5L * (a + b);
    long double left = gl20_rule(q->fn, q->ctx, a, mid);
    long double right = gl20_rule(q->fn, q->ctx, mid, b);
    long double halves = left + right;
    /* The test compares the one-piece rule with the two-half rule, so it
     * bounds the error of the one-piece value; the halves returned are far
     * better than that (Gauss-Legendre error falls like h^40 on an analytic
     * integrand). The second criterion, relative to the piece itself, keeps
     * two cases from bisecting down to the depth limit: a narrow peak that
     * the first whole-interval estimate missed (the absolute tolerance would
     * then be far too small), and integrands like exp(-9000 + ...) whose
     * evaluation noise (|exponent| x 1e-19) exceeds 1e-16 relative. The
     * integrands here are non-negative, so |halves| is not a cancelled sum. */
    long double err = fabsl(halves - whole);
    if (err <= q->tol || err <= LOCAL_REL_TOL * fabsl(halves))
        return halves;
    if (depth >= KVQ_CB_QUAD_MAX_DEPTH || !(mid > a && mid < b) || ++q->pieces > MAX_PIECES) {
        q->ok = 0;
        return halves;
    }
    return adapt(q, a, mid, left, depth + 1) + adapt(q, mid, b, right, depth + 1);
}

long double kvq_cb_integrate(kvq_cb_integrand fn, const void *ctx, long double a, long double b,
                             long double rel_tol, int *ok)
{
    if (!(b > a))
        return 0.0L;
    long double whole = gl20_rule(fn, ctx, a, b);
    /* The tolerance is absolute, relative to the first estimate of the whole
     * integral, so negligible tails are not refined to their own (pointless)
     * relative accuracy. It is not halved per level: the accepted halves are
     * far more accurate than the difference tested. The floor of 1e-4000
     * stops the bisection of integrands that vanish (underflow). */
    struct quad_state q = {fn, ctx, rel_tol * fabsl(whole), 0, 1};
    if (q.tol < 1e-4000L)
        q.tol = 1e-4000L;
    long double r = adapt(&q, a, b, whole, 0);
    if (!q.ok && ok)
        *ok = 0;
    return r;
}
