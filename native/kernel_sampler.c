/* Kernel-side interval sampling for the perf collector's `sampling: kernel` mode.
 *
 * Instead of a thread woken every interval to read the groups, each group on the launched
 * command is opened once per CPU (inherit, enable_on_exec) with a task-clock leader that samples
 * every interval_ns of a thread's CPU time: the kernel writes PERF_SAMPLE_TID | TIME | READ
 * records into each leader's mmap ring (Linux >= 6.12 for inherit + SAMPLE_READ: a sample then
 * carries the sampled thread's own cumulative counts of that CPU's inherited event). Python
 * polls the rings twice a second. Here the samples become the tick sampler's rows: per
 * (group, tid), the change since its previous sample, summed into the
 * wall-time bucket of width interval_ns that holds the sample's time; buckets with no sample are
 * zero. At the end the groups' final reads minus what the samples carried (each thread's tail
 * after its last sample; exited threads' folded into the parent's counts) go into the last
 * bucket, so the totals are the tick's. See counterprof_native.h for the contract.
 */
#define _GNU_SOURCE
#include "kernel_sampler.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef PERF_FLAG_FD_CLOEXEC
#define PERF_FLAG_FD_CLOEXEC (1UL << 3)
#endif

#define KS_MAX_MEMBERS 64
/* a record: header, pid+tid, time, {nr, enabled, running, values[nr]} */
#define KS_RECORD_MAX (sizeof(struct perf_event_header) + 16 + 8 * (3 + KS_MAX_MEMBERS))

struct ks_group {
    int fd;
    int n;                  /* members, leader first */
    int32_t *slots;         /* per member: output slot, or -1 (a timing leader not reported) */
    void *ring;
    size_t map_bytes;
    uint64_t *carried;      /* [enabled, running, values...]: the sum of every delta taken */
};

struct ks_thread {          /* one (group, tid): its counts at its last sample */
    uint64_t key;           /* (group + 1) << 32 | tid; 0 = empty */
    uint64_t *last;         /* [enabled, running, values...] */
};

struct cp_ks {
    int nslots;
    int64_t interval_ns, t0, time_offset_ns;
    int ring_pages;
    long page;
    int ngroups, cap_groups;
    struct ks_group *groups;

    size_t cap_threads, nthreads;
    struct ks_thread *threads;

    /* buckets base .. base + nbuckets - 1 (index from t0), not yet drained */
    int64_t base;
    int64_t nbuckets, cap_buckets;
    double *b_sum;          /* [bucket * nslots + slot] */
    int64_t ready;          /* buckets from base that are final */
    int64_t end_ns;         /* the stop's time: the last bucket ends here (0 while running) */
    int finished;
    struct cp_ks_stats stats;
};

static int64_t ks_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int cp_ks_event_open(const struct cp_event_spec *spec, int pid, int cpu, int group_fd,
                     int64_t sample_period_ns) {
    struct perf_event_attr attr;
    cp_build_attr(spec, &attr);
    /* sample times on the sampler's clock; a group's members must share their leader's */
    attr.use_clockid = 1;
    attr.clockid = CLOCK_MONOTONIC;
    if (sample_period_ns > 0) {
        attr.sample_period = (uint64_t)sample_period_ns;
        attr.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_READ;
    }
    long fd = syscall(SYS_perf_event_open, &attr, pid, cpu, group_fd, PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -errno : (int)fd;
}

cp_ks *cp_ks_new(int nslots, int64_t interval_ns, int ring_pages, int *err) {
    *err = 0;
    if (nslots <= 0 || interval_ns < 100000 || ring_pages < 1 || (ring_pages & (ring_pages - 1))) {
        *err = -EINVAL;
        return NULL;
    }
    cp_ks *k = calloc(1, sizeof(*k));
    if (!k) {
        *err = -ENOMEM;
        return NULL;
    }
    k->nslots = nslots;
    k->interval_ns = interval_ns;
    k->ring_pages = ring_pages;
    k->page = sysconf(_SC_PAGESIZE);
    return k;
}

int cp_ks_add_group(cp_ks *k, int leader_fd, int nmembers, const int32_t *member_slots) {
    if (nmembers <= 0 || nmembers > KS_MAX_MEMBERS || k->t0) return -EINVAL;
    for (int m = 0; m < nmembers; m++)
        if (member_slots[m] >= k->nslots) return -EINVAL;
    if (k->ngroups == k->cap_groups) {
        int cap = k->cap_groups ? k->cap_groups * 2 : 16;
        struct ks_group *g = realloc(k->groups, (size_t)cap * sizeof(*g));
        if (!g) return -ENOMEM;
        k->groups = g;
        k->cap_groups = cap;
    }
    struct ks_group *g = &k->groups[k->ngroups];
    memset(g, 0, sizeof(*g));
    g->fd = leader_fd;
    g->n = nmembers;
    g->map_bytes = (size_t)(k->ring_pages + 1) * (size_t)k->page;
    g->ring = mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, leader_fd, 0);
    if (g->ring == MAP_FAILED) return -errno;
    g->slots = malloc((size_t)nmembers * sizeof(int32_t));
    g->carried = calloc((size_t)nmembers + 2, sizeof(uint64_t));
    if (!g->slots || !g->carried) {
        munmap(g->ring, g->map_bytes);
        free(g->slots);
        free(g->carried);
        return -ENOMEM;
    }
    memcpy(g->slots, member_slots, (size_t)nmembers * sizeof(int32_t));
    k->ngroups++;
    return 0;
}

void cp_ks_start(cp_ks *k) {
    if (!k->t0) k->t0 = ks_mono_ns();
}

void cp_ks_set_time_offset(cp_ks *k, int64_t offset_ns) { k->time_offset_ns = offset_ns; }

/* ---- per (group, tid) state: open addressing, grown at half full ---------------------- */

static struct ks_thread *thread_slot(struct ks_thread *tab, size_t cap, uint64_t key) {
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
    while (tab[h].key != 0 && tab[h].key != key) h = (h + 1) & (cap - 1);
    return &tab[h];
}

static struct ks_thread *thread_get(cp_ks *k, uint64_t key, int width) {
    if (2 * (k->nthreads + 1) > k->cap_threads) {
        size_t cap = k->cap_threads ? k->cap_threads * 2 : 256;
        struct ks_thread *tab = calloc(cap, sizeof(*tab));
        if (!tab) return NULL;
        for (size_t i = 0; i < k->cap_threads; i++)
            if (k->threads[i].key) *thread_slot(tab, cap, k->threads[i].key) = k->threads[i];
        free(k->threads);
        k->threads = tab;
        k->cap_threads = cap;
    }
    struct ks_thread *t = thread_slot(k->threads, k->cap_threads, key);
    if (t->key == 0) {
        t->last = calloc((size_t)width, sizeof(uint64_t));
        if (!t->last) return NULL;
        t->key = key;
        k->nthreads++;
    }
    return t;
}

/* ---- buckets ------------------------------------------------------------------------- */

/* The window's row for bucket b (grown as needed); a bucket already drained takes the first
 * one still held (counted as late: its count is kept, a little later than it happened). */
static int64_t bucket_row(cp_ks *k, int64_t b) {
    if (b < k->base) {         /* drained already */
        k->stats.late_samples++;
        b = k->base;
    }
    int64_t i = b - k->base;
    if (i >= k->cap_buckets) {
        int64_t cap = k->cap_buckets ? k->cap_buckets : 64;
        while (cap <= i) cap *= 2;
        size_t cells = (size_t)cap * (size_t)k->nslots;
        double *s = realloc(k->b_sum, cells * sizeof(double));
        if (!s) return -1;
        k->b_sum = s;
        k->cap_buckets = cap;
    }
    if (i >= k->nbuckets) {
        size_t from = (size_t)k->nbuckets * k->nslots, to = (size_t)(i + 1) * k->nslots;
        memset(k->b_sum + from, 0, (to - from) * sizeof(double));
        k->nbuckets = i + 1;
    }
    return i;
}

static int64_t bucket_of(cp_ks *k, int64_t t) {
    return t <= k->t0 ? 0 : (t - k->t0) / k->interval_ns;
}

/* One delta of a group ([enabled, running, values...]) into bucket b's slots. */
static void add_delta(cp_ks *k, struct ks_group *g, int64_t b, const uint64_t *d) {
    int64_t row = bucket_row(k, b);
    if (row < 0) {
        k->stats.dropped++;
        return;
    }
    for (int m = 0; m < g->n; m++) {
        g->carried[2 + m] += d[2 + m];
        int32_t s = g->slots[m];
        if (s < 0) continue;
        /* Not scaled: a task's event on CPU i is enabled while the task runs anywhere and
         * running only while it runs on CPU i, so enabled/running here is the task's spread
         * over the CPUs, not multiplexing (cp_scale_delta would count it once per CPU). */
        k->b_sum[(size_t)row * k->nslots + s] += (double)d[2 + m];
    }
    g->carried[0] += d[0];
    g->carried[1] += d[1];
}

/* ---- the rings ----------------------------------------------------------------------- */

static void sample(cp_ks *k, int gi, const char *rec, size_t size) {
    struct ks_group *g = &k->groups[gi];
    size_t need = sizeof(struct perf_event_header) + 16 + 8 * (3 + (size_t)g->n);
    if (size < need) {
        k->stats.bad_records++;
        return;
    }
    const uint32_t *ids = (const uint32_t *)(rec + sizeof(struct perf_event_header));
    const uint64_t *w = (const uint64_t *)(rec + sizeof(struct perf_event_header) + 8);
    uint32_t tid = ids[1];
    int64_t time = (int64_t)w[0];
    if (w[1] != (uint64_t)g->n) {
        k->stats.bad_records++;
        return;
    }
    const uint64_t *cur = w + 2;           /* enabled, running, values */
    k->stats.samples++;
    struct ks_thread *t = thread_get(k, ((uint64_t)(gi + 1) << 32) | tid, g->n + 2);
    if (!t) {
        k->stats.dropped++;
        return;
    }
    uint64_t d[2 + KS_MAX_MEMBERS];
    int fresh = 0;
    for (int i = 0; i < g->n + 2; i++)
        if (cur[i] < t->last[i]) fresh = 1;  /* a new thread under a reused tid: counts from 0 */
    for (int i = 0; i < g->n + 2; i++) d[i] = fresh ? cur[i] : cur[i] - t->last[i];
    memcpy(t->last, cur, (size_t)(g->n + 2) * sizeof(uint64_t));
    add_delta(k, g, bucket_of(k, time), d);
}

static void drain_ring(cp_ks *k, int gi) {
    struct ks_group *g = &k->groups[gi];
    struct perf_event_mmap_page *meta = g->ring;
    uint64_t off = meta->data_offset ? meta->data_offset : (uint64_t)k->page;
    uint64_t size = meta->data_size ? meta->data_size : (uint64_t)k->ring_pages * k->page;
    const char *data = (const char *)g->ring + off;
    uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = meta->data_tail;
    char rec[KS_RECORD_MAX];
    while (tail + sizeof(struct perf_event_header) <= head) {
        struct perf_event_header h;
        for (size_t i = 0; i < sizeof h; i++) ((char *)&h)[i] = data[(tail + i) & (size - 1)];
        if (h.size < sizeof h || tail + h.size > head) {
            k->stats.bad_records++;
            tail = head;        /* a torn ring: skip what is there rather than loop */
            break;
        }
        if (h.type == PERF_RECORD_SAMPLE || h.type == PERF_RECORD_LOST) {
            size_t n = h.size < sizeof rec ? h.size : sizeof rec;
            for (size_t i = 0; i < n; i++) rec[i] = data[(tail + i) & (size - 1)];
            if (h.type == PERF_RECORD_SAMPLE) sample(k, gi, rec, n);
            else if (n >= sizeof h + 16)     /* {id, lost} */
                k->stats.lost += ((const uint64_t *)(rec + sizeof h))[1];
        }
        tail += h.size;
    }
    __atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
}

/* Buckets that end before `now` less a margin are final: a sample stamped earlier than the
 * rings' heads we just read is in them (it is written at its own time, in its own context). */
#define KS_MARGIN_NS 10000000LL

int cp_ks_poll(cp_ks *k) {
    if (!k->t0 || k->finished) return (int)(k->ready * k->nslots);
    int64_t now = ks_mono_ns();
    for (int g = 0; g < k->ngroups; g++) drain_ring(k, g);
    int64_t done = (now - KS_MARGIN_NS - k->t0) / k->interval_ns;   /* buckets [0, done) final */
    /* the quiet ones too: zero rows, not gaps (out of memory: they wait for the next poll) */
    if (done > k->base + k->ready && bucket_row(k, done - 1) >= 0) k->ready = done - k->base;
    return (int)(k->ready * k->nslots);
}

int cp_ks_finish(cp_ks *k) {
    if (!k->t0 || k->finished) return 0;
    int rc = 0;
    /* counting stops first, so the rings' last samples and the final reads agree */
    for (int g = 0; g < k->ngroups; g++) cp_ioctl_disable(k->groups[g].fd, 1);
    int64_t now = ks_mono_ns();
    for (int g = 0; g < k->ngroups; g++) drain_ring(k, g);
    int64_t last = bucket_of(k, now);
    if (last < k->base) last = k->base;
    for (int gi = 0; gi < k->ngroups; gi++) {
        struct ks_group *g = &k->groups[gi];
        uint64_t words[3 + KS_MAX_MEMBERS];
        int n = cp_read_words(g->fd, words, g->n + 3);
        if (n != g->n + 3 || words[0] != (uint64_t)g->n) {
            k->stats.read_errors++;
            rc = n < 0 ? n : -EIO;
            continue;
        }
        uint64_t d[2 + KS_MAX_MEMBERS];
        for (int i = 0; i < g->n + 2; i++) {
            uint64_t fin = words[1 + i];
            d[i] = fin > g->carried[i] ? fin - g->carried[i] : 0;
        }
        add_delta(k, g, last, d);
    }
    if (bucket_row(k, last) < 0) rc = -ENOMEM;
    k->end_ns = now;
    k->ready = k->nbuckets;
    k->finished = 1;
    return rc;
}

int cp_ks_drain(cp_ks *k, int max_records, int64_t *time_ns, int64_t *duration_ns, int32_t *slot,
                double *value, float *quality, uint8_t *validity) {
    int64_t nb = max_records / k->nslots;
    if (nb > k->ready) nb = k->ready;
    memset(validity, 0, ((size_t)nb * k->nslots + 7) / 8);
    int out = 0;
    for (int64_t i = 0; i < nb; i++) {
        int64_t b = k->base + i;
        int64_t start = k->t0 + b * k->interval_ns, end = start + k->interval_ns;
        if (k->finished && i == k->nbuckets - 1 && k->end_ns > start && k->end_ns < end) end = k->end_ns;
        for (int s = 0; s < k->nslots; s++, out++) {
            size_t c = (size_t)i * k->nslots + s;
            time_ns[out] = end + k->time_offset_ns;
            duration_ns[out] = end - start;
            slot[out] = s;
            quality[out] = 1.0f;
            value[out] = k->b_sum[c];
            validity[out / 8] |= (uint8_t)(1u << (out % 8));
        }
    }
    size_t cells = (size_t)nb * k->nslots, left = (size_t)(k->nbuckets - nb) * k->nslots;
    if (nb > 0 && left > 0) {
        memmove(k->b_sum, k->b_sum + cells, left * sizeof(double));
    }
    k->base += nb;
    k->nbuckets -= nb;
    k->ready -= nb;
    k->stats.rows += (uint64_t)out;
    return out;
}

void cp_ks_get_stats(cp_ks *k, struct cp_ks_stats *out) {
    *out = k->stats;
    out->threads = k->nthreads;
}

void cp_ks_free(cp_ks *k) {
    if (!k) return;
    for (int g = 0; g < k->ngroups; g++) {
        munmap(k->groups[g].ring, k->groups[g].map_bytes);
        free(k->groups[g].slots);
        free(k->groups[g].carried);
    }
    for (size_t i = 0; i < k->cap_threads; i++) free(k->threads[i].last);
    free(k->threads);
    free(k->groups);
    free(k->b_sum);
    free(k);
}
