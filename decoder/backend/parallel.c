/* parallel.c - the worker pool of parallel.h and kvq_set_threads.
 *
 * Workers sleep on a condition variable between loops; a loop publishes
 * (fn, ctx, n) with a new generation number, the caller and the woken
 * workers take task indices from one atomic counter, and the caller waits
 * until every participant has finished. One loop at a time: a second caller
 * (try-lock fails) runs its loop alone, so the pool never deadlocks and
 * never interleaves two loops' tasks.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvq_model.h"
#include "parallel.h"

#define MAX_THREADS 256

static struct {
    pthread_mutex_t lock; /* held by the caller for the whole loop */
    pthread_mutex_t mu;   /* protects the fields below */
    pthread_cond_t wake, done;
    pthread_t tid[MAX_THREADS];
    int n_workers;        /* threads besides the caller */
    unsigned long gen;    /* loop number */
    int stop;
    int busy;             /* workers still in the current loop */
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

static void *worker(void *arg)
{
    const int w = (int)(size_t)arg; /* 1 .. n_workers */
    unsigned long seen = 0;
    pthread_mutex_lock(&P.mu);
    for (;;) {
        while (!P.stop && P.gen == seen)
            pthread_cond_wait(&P.wake, &P.mu);
        if (P.stop)
            break;
        seen = P.gen;
        if (w < P.max_workers) {
            pthread_mutex_unlock(&P.mu);
            run_tasks(w);
            pthread_mutex_lock(&P.mu);
        }
        if (--P.busy == 0)
            pthread_cond_signal(&P.done);
    }
    pthread_mutex_unlock(&P.mu);
    return NULL;
}

static void stop_workers(void)
{
    pthread_mutex_lock(&P.mu);
    P.stop = 1;
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.n_workers; i++)
        pthread_join(P.tid[i], NULL);
    P.n_workers = 0;
    P.stop = 0;
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
    P.busy = P.n_workers;
    P.gen++;
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    run_tasks(0);
    pthread_mutex_lock(&P.mu);
    while (P.busy > 0)
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
