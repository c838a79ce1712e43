/* parallel.c - the worker pool of parallel.h and kvq_set_threads.
 *
 * A loop publishes (fn, ctx, n) with a new generation number, the caller and
 * the workers take task indices from one atomic counter, and the caller waits
 * until every participant has finished. One loop at a time: a second caller
 * (try-lock fails) runs its loop alone, so the pool never deadlocks and
 * never interleaves two loops' tasks.
 *
 * Between loops a worker first spins on the generation number for up to
 * SPIN_NS, then sleeps on a condition variable; the caller likewise spins on
 * the count of busy workers before it sleeps. A prefill runs ~1,000 loops of
 * 0.1-1 ms (products, attention pages) separated by short serial steps, and
 * waking a sleeping thread (futex, in a VM an inter-processor interrupt to an
 * idle vCPU) took tens of microseconds each time: the late starter then
 * finished last, a loss that grew with every added thread (issue 44).
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "kvq_model.h"
#include "parallel.h"

#define MAX_THREADS 256

/* How long an idle worker (or the waiting caller) spins before it sleeps:
 * longer than the serial steps between two loops of one forward (norms,
 * RoPE, page appends: up to ~0.1 ms), short enough that an idle process
 * gives its cores back at once. */
#define SPIN_NS 200000L

static struct {
    pthread_mutex_t lock; /* held by the caller for the whole loop */
    pthread_mutex_t mu;   /* protects the fields below */
    pthread_cond_t wake, done;
    pthread_t tid[MAX_THREADS];
    int n_workers;        /* threads besides the caller */
    atomic_ulong gen;     /* loop number (read without mu by spinning workers) */
    atomic_int stop;
    atomic_int busy;      /* workers still in the current loop */
    void (*fn)(void *, int, int);
    void *ctx;
    int n, max_workers;
    atomic_int next;
} P = {.lock = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void run_tasks(int w)
{
    for (int i; (i = atomic_fetch_add(&P.next, 1)) < P.n;)
        P.fn(P.ctx, i, w);
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Spins until *v != old (then 1) or SPIN_NS have passed (then 0). */
static int spin_ulong(atomic_ulong *v, unsigned long old)
{
    long t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old || atomic_load(&P.stop))
            return 1;
        cpu_relax();
        if (i % 64 == 63) { /* the clock every ~64 pauses: cheap, still precise enough */
            long t = now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                return 0;
        }
    }
}

static void *worker(void *arg)
{
    const int w = (int)(size_t)arg; /* 1 .. n_workers */
    unsigned long seen = 0;
    for (;;) {
        if (!spin_ulong(&P.gen, seen)) {
            pthread_mutex_lock(&P.mu);
            while (!atomic_load(&P.stop) && atomic_load(&P.gen) == seen)
                pthread_cond_wait(&P.wake, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        if (atomic_load(&P.stop))
            break;
        /* acquire on gen: the loop's fields, written before it, are visible */
        seen = atomic_load_explicit(&P.gen, memory_order_acquire);
        if (w < P.max_workers)
            run_tasks(w);
        if (atomic_fetch_sub(&P.busy, 1) == 1) {
            /* the caller may be asleep: signal under mu so the wake-up is not lost */
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.done);
            pthread_mutex_unlock(&P.mu);
        }
    }
    return NULL;
}

static void stop_workers(void)
{
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.stop, 1);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.n_workers; i++)
        pthread_join(P.tid[i], NULL);
    P.n_workers = 0;
    atomic_store(&P.stop, 0);
    atomic_store(&P.gen, 0); /* new workers start from seen = 0 */
}

static void start_workers(int threads)
{
    int want = threads - 1 < MAX_THREADS ? threads - 1 : MAX_THREADS;
    for (int i = 0; i < want; i++) {
        if (pthread_create(&P.tid[i], NULL, worker, (void *)(size_t)(i + 1)) != 0)
            break; /* fewer threads: still correct */
        P.n_workers++;
    }
}

static int cores_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* A forked child has none of the workers: its loops run on its one thread. */
static void after_fork_child(void)
{
    P.n_workers = 0;
}

static void init_default(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
    start_workers(cores_available());
    /* the products split their sgemm calls over this pool (backend_cpu.c) */
    openblas_set_num_threads(1);
}

int kvq_par_threads(void)
{
    pthread_once(&once, init_default);
    return P.n_workers + 1;
}

void kvq_par_for(int n, int max_workers, void (*fn)(void *ctx, int i, int w), void *ctx)
{
    pthread_once(&once, init_default);
    if (n <= 1 || max_workers <= 1 || P.n_workers == 0 || pthread_mutex_trylock(&P.lock) != 0) {
        for (int i = 0; i < n; i++)
            fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&P.mu);
    P.fn = fn;
    P.ctx = ctx;
    P.n = n;
    P.max_workers = max_workers;
    atomic_store(&P.next, 0);
    atomic_store(&P.busy, P.n_workers);
    atomic_fetch_add_explicit(&P.gen, 1, memory_order_release); /* publishes the fields above */
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    run_tasks(0);
    long t0 = 0;
    for (unsigned i = 0; atomic_load(&P.busy) > 0; i++) {
        cpu_relax();
        if (i % 64 == 63) {
            long t = now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
        }
    }
    pthread_mutex_lock(&P.mu);
    while (atomic_load(&P.busy) > 0)
        pthread_cond_wait(&P.done, &P.mu);
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.lock);
}

int kvq_set_threads(int n)
{
    pthread_once(&once, init_default);
    if (n <= 0)
        n = cores_available();
    if (n > MAX_THREADS + 1)
        n = MAX_THREADS + 1;
    pthread_mutex_lock(&P.lock); /* no loop is running */
    if (n != P.n_workers + 1) {
        stop_workers();
        start_workers(n);
    }
    pthread_mutex_unlock(&P.lock);
    openblas_set_num_threads(1); /* see init_default */
    return P.n_workers + 1;
}

int kvq_threads(void)
{
    return kvq_par_threads();
}
