/* counterprof native core. See counterprof_native.h for the contract. */
#define _GNU_SOURCE
#include "counterprof_native.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <math.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef PERF_FLAG_FD_CLOEXEC
#define PERF_FLAG_FD_CLOEXEC (1UL << 3)
#endif

/* ---- perf_event_open and friends ------------------------------------------------ */

size_t cp_attr_size(void) { return sizeof(struct perf_event_attr); }

void cp_build_attr(const struct cp_event_spec *spec, void *out) {
    struct perf_event_attr *attr = out;
    memset(attr, 0, sizeof(*attr));
    attr->size = sizeof(*attr);
    attr->type = spec->type;
    attr->config = spec->config;
    attr->config1 = spec->config1;
    attr->config2 = spec->config2;
    attr->read_format = spec->read_format;
    attr->disabled = spec->disabled ? 1 : 0;
    attr->inherit = spec->inherit ? 1 : 0;
    attr->enable_on_exec = spec->enable_on_exec ? 1 : 0;
    attr->pinned = spec->pinned ? 1 : 0;
    attr->exclusive = spec->exclusive ? 1 : 0;
    attr->exclude_user = spec->exclude_user ? 1 : 0;
    attr->exclude_kernel = spec->exclude_kernel ? 1 : 0;
    attr->exclude_hv = spec->exclude_hv ? 1 : 0;
    attr->exclude_idle = spec->exclude_idle ? 1 : 0;
    attr->exclude_host = spec->exclude_host ? 1 : 0;
    attr->exclude_guest = spec->exclude_guest ? 1 : 0;
    attr->precise_ip = spec->precise_ip & 3;
}

int cp_event_open(const struct cp_event_spec *spec, int pid, int cpu, int group_fd) {
    struct perf_event_attr attr;
    cp_build_attr(spec, &attr);
    long fd = syscall(SYS_perf_event_open, &attr, pid, cpu, group_fd, PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -errno : (int)fd;
}

static int cp_ioctl(int fd, unsigned long request, int whole_group) {
    int rc = ioctl(fd, request, whole_group ? PERF_IOC_FLAG_GROUP : 0);
    return rc < 0 ? -errno : 0;
}

int cp_ioctl_enable(int fd, int whole_group) { return cp_ioctl(fd, PERF_EVENT_IOC_ENABLE, whole_group); }
int cp_ioctl_disable(int fd, int whole_group) { return cp_ioctl(fd, PERF_EVENT_IOC_DISABLE, whole_group); }
int cp_ioctl_reset(int fd, int whole_group) { return cp_ioctl(fd, PERF_EVENT_IOC_RESET, whole_group); }

int cp_read_words(int fd, uint64_t *words, int max_words) {
    ssize_t n;
    do {
        n = read(fd, words, (size_t)max_words * sizeof(uint64_t));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    return (int)(n / (ssize_t)sizeof(uint64_t));
}

int cp_close(int fd) { return close(fd) < 0 ? -errno : 0; }

int cp_gettid(void) { return (int)syscall(SYS_gettid); }

/* ---- scaling ----------------------------------------------------------------------- */

int cp_scale_delta(uint64_t d_value, uint64_t d_enabled, uint64_t d_running, double *scaled) {
    if (d_enabled == 0) {        /* not scheduled at all: for a task counter, its task slept */
        *scaled = (double)d_value;
        return 1;
    }
    if (d_running == 0) {        /* enabled but multiplexed out for the whole interval */
        *scaled = NAN;
        return 0;
    }
    if (d_running >= d_enabled) {
        *scaled = (double)d_value;
    } else {
        *scaled = (double)d_value * ((double)d_enabled / (double)d_running);
    }
    return 1;
}

struct cp_acc {
    double sum;
    uint64_t enabled;
    uint64_t running;
    int unknown;
};

static void acc_add(struct cp_acc *a, uint64_t dv, uint64_t de, uint64_t dr) {
    double scaled;
    if (!cp_scale_delta(dv, de, dr, &scaled)) a->unknown = 1;
    else a->sum += scaled;
    a->enabled += de;
    a->running += dr < de ? dr : de;
}

static int acc_finish(const struct cp_acc *a, double *value, float *quality) {
    *quality = a->enabled ? (float)((double)a->running / (double)a->enabled) : 1.0f;
    if (a->unknown) {
        *value = NAN;
        return 0;
    }
    *value = a->sum;
    return 1;
}

int cp_aggregate(int n, const uint64_t *d_value, const uint64_t *d_enabled,
                 const uint64_t *d_running, double *value, float *quality) {
    struct cp_acc a = {0};
    for (int i = 0; i < n; i++) acc_add(&a, d_value[i], d_enabled[i], d_running[i]);
    return acc_finish(&a, value, quality);
}

/* ---- the sampler --------------------------------------------------------------------- */

struct cp_group {
    int fd;
    int n;
    int32_t *slots;
    uint64_t *prev;      /* [enabled, running, values...] of the last stored tick */
    uint64_t *cur;       /* read buffer: [nr, enabled, running, values...] */
    int have_prev;
    int ok;              /* the last read succeeded */
};

struct cp_sampler {
    pthread_t thread;
    int thread_started;
    int tid;
    pthread_mutex_t mu;
    pthread_cond_t cond;       /* wakes the thread: start, stop, quit */
    pthread_cond_t done;       /* the thread answers: tid known, stop finished */
    int running;
    int stop_requested;
    int quit;
    int64_t interval_ns;

    int ngroups, cap_groups;
    struct cp_group *groups;

    int nslots;
    struct cp_acc *acc;        /* per slot, reused each tick */
    struct cp_slot_stats *slot_stats;
    int64_t prev_time;
    int64_t time_offset_ns;    /* added at drain: monotonic -> the session's epoch axis */

    /* ring of ticks; each tick holds nslots records */
    int ring_ticks, head, count;
    int64_t *r_time, *r_dur;
    double *r_value;
    float *r_quality;
    uint8_t *r_valid;

    struct cp_sampler_stats stats;

    /* schedstat files read every sched_every ticks (cp_sampler_watch_schedstats): the critical
     * threads, each with its own epoch (the watch's first epoch + its index) */
    int sched_n, sched_every, sched_left;
    int sched_fd[CP_SCHED_WATCH];          /* -1: not read (none, or its thread is gone) */
    int32_t sched_epoch_of[CP_SCHED_WATCH];
    int32_t sched_epoch;                   /* the last epoch given out */
    int sched_head, sched_count;
    int64_t sched_time[CP_SCHED_RING], sched_run[CP_SCHED_RING], sched_wait[CP_SCHED_RING];
    int32_t sched_tag[CP_SCHED_RING];
    /* each watched fd's last reading (time, run, wait) and epoch (0: none), for the spill's deltas */
    int64_t sched_last[CP_SCHED_WATCH][3];
    int32_t sched_last_epoch[CP_SCHED_WATCH];

    cp_spill *spill;           /* NULL: no spill (cp_sampler_set_spill) */

    /* riders (cp_sampler_add_rider): called on the tick, outside mu, under rider_mu, so a
     * removal that returns guarantees no call is running or will run */
    pthread_mutex_t rider_mu;
    struct cp_rider {
        int id, every, left;
        int (*fn)(void *arg, int64_t now_ns);
        void *arg;
    } riders[CP_MAX_RIDERS];
    int nriders, rider_ids;
};

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static struct timespec to_timespec(int64_t ns) {
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    return ts;
}

/* One watched schedstat read into the ring (and the spill); under the lock. */
static void sched_read(cp_sampler *s, int i, int64_t now) {
    char buf[128];
    int64_t run = -1, wait = 0;
    ssize_t n = pread(s->sched_fd[i], buf, sizeof(buf) - 1, 0);
    if (n > 0) {
        buf[n] = 0;
        char *end;
        long long r = strtoll(buf, &end, 10);
        if (end != buf) {
            char *end2;
            long long w = strtoll(end, &end2, 10);
            if (end2 != end && r >= 0 && w >= 0) {
                run = r;
                wait = w;
            }
        }
    }
    if (run < 0) s->sched_fd[i] = -1;   /* the thread is gone: the caller watches the next one */
    int32_t epoch = s->sched_epoch_of[i];
    int idx;
    if (s->sched_count < CP_SCHED_RING) {
        idx = (s->sched_head + s->sched_count) % CP_SCHED_RING;
        s->sched_count++;
    } else {
        idx = (s->sched_head + CP_SCHED_RING - 1) % CP_SCHED_RING;   /* full: the newest merges */
    }
    s->sched_time[idx] = now;
    s->sched_run[idx] = run;
    s->sched_wait[idx] = wait;
    s->sched_tag[idx] = epoch;
    int64_t *last = s->sched_last[i];
    if (s->spill) {
        int64_t rec[8] = {now + s->time_offset_ns, run, wait, 0, last[0], last[1], last[2], 0};
        int32_t tags[2] = {epoch, s->sched_last_epoch[i]};
        memcpy(&rec[3], &tags[0], 4);
        memcpy(&rec[7], &tags[1], 4);
        const void *parts[1] = {rec};
        uint32_t lens[1] = {sizeof(rec)};
        cp_spill_add(s->spill, CP_SPILL_SCHED, 1, parts, lens);
    }
    last[0] = now + s->time_offset_ns;
    last[1] = run;
    last[2] = wait;
    s->sched_last_epoch[i] = run < 0 ? 0 : epoch;
}

/* The watched schedstats, into the ring; under the lock (the fds may change between ticks).
 * `force`: read now whatever the countdown says (the last tick before a stop). */
static void sched_tick(cp_sampler *s, int64_t now, int force) {
    if (s->sched_n == 0) return;
    if (--s->sched_left > 0 && !force) return;
    s->sched_left = s->sched_every;
    for (int i = 0; i < s->sched_n; i++)
        if (s->sched_fd[i] >= 0) sched_read(s, i, now);
}

/* The riders due on this tick, in the order they were added. */
static void run_riders(cp_sampler *s, int64_t now) {
    pthread_mutex_lock(&s->rider_mu);
    for (int i = 0; i < s->nriders; i++) {
        struct cp_rider *r = &s->riders[i];
        if (--r->left > 0) continue;
        r->left = r->every;
        r->fn(r->arg, now);
    }
    pthread_mutex_unlock(&s->rider_mu);
}

/* Read every group; with `store`, turn the change since the last stored tick into
 * one tick of records. Returns 1 when a tick was stored. Called without the lock,
 * except for the ring update at the end. */
static int sampler_tick(cp_sampler *s, int store) {
    int64_t now = mono_ns();
    for (int i = 0; i < s->nslots; i++) memset(&s->acc[i], 0, sizeof(s->acc[i]));
    for (int g = 0; g < s->ngroups; g++) {
        struct cp_group *grp = &s->groups[g];
        int words = cp_read_words(grp->fd, grp->cur, grp->n + 3);
        grp->ok = words == grp->n + 3 && grp->cur[0] == (uint64_t)grp->n;
        if (!grp->ok) {
            s->stats.read_errors++;
            s->stats.last_read_errno = words < 0 ? -words : EIO;
            for (int m = 0; m < grp->n; m++) s->acc[grp->slots[m]].unknown = 1;
            continue;
        }
        if (!store || !grp->have_prev) continue;
        uint64_t de = grp->cur[1] - grp->prev[0];
        uint64_t dr = grp->cur[2] - grp->prev[1];
        if (grp->cur[1] < grp->prev[0] || grp->cur[2] < grp->prev[1]) {
            for (int m = 0; m < grp->n; m++) s->acc[grp->slots[m]].unknown = 1;
            continue;
        }
        for (int m = 0; m < grp->n; m++) {
            uint64_t v = grp->cur[3 + m], pv = grp->prev[2 + m];
            if (v < pv) s->acc[grp->slots[m]].unknown = 1;   /* counter went backwards: reset */
            else acc_add(&s->acc[grp->slots[m]], v - pv, de, dr);
        }
    }

    int stored = 0;
    pthread_mutex_lock(&s->mu);
    if (store) sched_tick(s, now, s->stop_requested);
    if (!store) {
        stored = 0;
    } else if (s->nslots == 0) {      /* riders only: nothing to keep */
        s->stats.ticks++;
        stored = 1;
    } else if (s->count < s->ring_ticks) {
        int idx = (s->head + s->count) % s->ring_ticks;
        s->r_time[idx] = now;
        s->r_dur[idx] = now - s->prev_time;
        for (int k = 0; k < s->nslots; k++) {
            double v;
            float q;
            size_t r = (size_t)idx * s->nslots + k;
            s->r_valid[r] = (uint8_t)acc_finish(&s->acc[k], &v, &q);
            s->r_value[r] = v;
            s->r_quality[r] = q;
            struct cp_slot_stats *st = &s->slot_stats[k];
            if (s->r_valid[r]) st->known++;
            else st->unknown++;
            if (q < st->min_quality) st->min_quality = q;
        }
        s->count++;
        s->stats.ticks++;
        stored = 1;
        if (s->spill) {
            size_t r0 = (size_t)idx * s->nslots;
            int64_t head[3] = {now + s->time_offset_ns, s->r_dur[idx], 0};
            int32_t n32 = s->nslots;
            memcpy(&head[2], &n32, 4);
            const void *parts[4] = {head, s->r_value + r0, s->r_quality + r0, s->r_valid + r0};
            uint32_t lens[4] = {sizeof(head), (uint32_t)(s->nslots * sizeof(double)),
                                (uint32_t)(s->nslots * sizeof(float)), (uint32_t)s->nslots};
            cp_spill_add(s->spill, CP_SPILL_PERF, 4, parts, lens);
        }
    } else {
        /* Ring full: keep the old baseline, so the next tick covers both intervals
         * and no count is lost, only resolution. */
        s->stats.coalesced++;
    }
    pthread_mutex_unlock(&s->mu);
    if (store) run_riders(s, now);   /* after the ring: a slow rider never shifts the counters' tick */

    if (!store || stored) {
        s->prev_time = now;
        for (int g = 0; g < s->ngroups; g++) {
            struct cp_group *grp = &s->groups[g];
            if (!grp->ok) continue;
            memcpy(grp->prev, grp->cur + 1, (size_t)(grp->n + 2) * sizeof(uint64_t));
            grp->have_prev = 1;
        }
    }
    return stored;
}

static void *sampler_main(void *arg) {
    cp_sampler *s = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);   /* signals belong to the Python main thread */

    /* named for top -H, perf and ps: it lives in the workload's process under profile() */
    prctl(PR_SET_NAME, "cp-sampler", 0, 0, 0);
    pthread_mutex_lock(&s->mu);
    s->tid = cp_gettid();
    pthread_cond_broadcast(&s->done);
    int64_t next = 0;
    while (!s->quit) {
        if (s->stop_requested) {
            if (s->running) {
                pthread_mutex_unlock(&s->mu);
                sampler_tick(s, 1);
                pthread_mutex_lock(&s->mu);
                s->running = 0;
            }
            s->stop_requested = 0;
            s->stats.cpu_ns = thread_cpu_ns();
            pthread_cond_broadcast(&s->done);
            continue;
        }
        if (!s->running) {
            pthread_cond_wait(&s->cond, &s->mu);
            next = mono_ns() + s->interval_ns;
            continue;
        }
        struct timespec deadline = to_timespec(next);
        int rc = pthread_cond_timedwait(&s->cond, &s->mu, &deadline);
        if (rc != ETIMEDOUT) continue;   /* woken: re-check the flags */
        pthread_mutex_unlock(&s->mu);
        sampler_tick(s, 1);
        int64_t now = mono_ns();
        next += s->interval_ns;
        if (now > next) {                /* fell behind: skip, do not burst */
            s->stats.late_ticks++;
            next = now + s->interval_ns;
        }
        pthread_mutex_lock(&s->mu);
        s->stats.cpu_ns = thread_cpu_ns();
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

cp_sampler *cp_sampler_new(int *err) {
    *err = 0;
    cp_sampler *s = calloc(1, sizeof(*s));
    if (!s) {
        *err = -ENOMEM;
        return NULL;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->done, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->rider_mu, NULL);
    s->sched_n = 0;

    int rc = pthread_create(&s->thread, NULL, sampler_main, s);
    if (rc != 0) {
        *err = -rc;
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->rider_mu);
        pthread_cond_destroy(&s->cond);
        pthread_cond_destroy(&s->done);
        free(s);
        return NULL;
    }
    s->thread_started = 1;
    pthread_mutex_lock(&s->mu);
    while (s->tid == 0) pthread_cond_wait(&s->done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return s;
}

int cp_sampler_thread_tid(cp_sampler *s) { return s->tid; }

int cp_sampler_add_group(cp_sampler *s, int leader_fd, int nmembers, const int32_t *member_slots) {
    if (nmembers <= 0) return -EINVAL;
    for (int m = 0; m < nmembers; m++)
        if (member_slots[m] < 0) return -EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->running) {
        rc = -EBUSY;
        goto out;
    }
    if (s->ngroups == s->cap_groups) {
        int cap = s->cap_groups ? s->cap_groups * 2 : 16;
        struct cp_group *g = realloc(s->groups, (size_t)cap * sizeof(*g));
        if (!g) {
            rc = -ENOMEM;
            goto out;
        }
        s->groups = g;
        s->cap_groups = cap;
    }
    struct cp_group *grp = &s->groups[s->ngroups];
    memset(grp, 0, sizeof(*grp));
    grp->fd = leader_fd;
    grp->n = nmembers;
    grp->slots = malloc((size_t)nmembers * sizeof(int32_t));
    grp->prev = calloc((size_t)nmembers + 2, sizeof(uint64_t));
    grp->cur = calloc((size_t)nmembers + 3, sizeof(uint64_t));
    if (!grp->slots || !grp->prev || !grp->cur) {
        free(grp->slots);
        free(grp->prev);
        free(grp->cur);
        rc = -ENOMEM;
        goto out;
    }
    memcpy(grp->slots, member_slots, (size_t)nmembers * sizeof(int32_t));
    s->ngroups++;
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int cp_sampler_start(cp_sampler *s, int nslots, int ring_ticks, int64_t interval_ns) {
    if (interval_ns < 100000) return -EINVAL;   /* below 0.1 ms the reads themselves dominate */
    if (nslots < 0 || ring_ticks <= 0) return -EINVAL;
    if (nslots == 0 && s->ngroups > 0) return -EINVAL;   /* 0 slots: a tick for riders only */
    size_t width = nslots > 0 ? (size_t)nslots : 1;     /* what a riders-only tick allocates */
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->running || s->acc) {
        rc = -EBUSY;   /* a sampler runs once */
        goto out;
    }
    for (int g = 0; g < s->ngroups; g++)
        for (int m = 0; m < s->groups[g].n; m++)
            if (s->groups[g].slots[m] >= nslots) {
                rc = -EINVAL;
                goto out;
            }
    s->nslots = nslots;
    s->ring_ticks = ring_ticks;
    s->acc = calloc(width, sizeof(*s->acc));
    s->slot_stats = calloc(width, sizeof(*s->slot_stats));
    if (s->slot_stats)
        for (int k = 0; k < nslots; k++) s->slot_stats[k].min_quality = 1.0f;
    s->r_time = calloc((size_t)ring_ticks, sizeof(int64_t));
    s->r_dur = calloc((size_t)ring_ticks, sizeof(int64_t));
    s->r_value = calloc((size_t)ring_ticks * width, sizeof(double));
    s->r_quality = calloc((size_t)ring_ticks * width, sizeof(float));
    s->r_valid = calloc((size_t)ring_ticks * width, 1);
    if (!s->acc || !s->slot_stats || !s->r_time || !s->r_dur || !s->r_value || !s->r_quality ||
        !s->r_valid) {
        rc = -ENOMEM;
        goto out;
    }
out:
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) return rc;
    sampler_tick(s, 0);   /* baseline */
    pthread_mutex_lock(&s->mu);
    s->interval_ns = interval_ns;
    s->running = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int cp_sampler_stop(cp_sampler *s) {
    pthread_mutex_lock(&s->mu);
    if (s->running) {
        s->stop_requested = 1;
        pthread_cond_broadcast(&s->cond);
        while (s->running) pthread_cond_wait(&s->done, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int cp_sampler_pending(cp_sampler *s) {
    pthread_mutex_lock(&s->mu);
    if (!s->nslots) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    int n = s->count * s->nslots;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int cp_sampler_drain(cp_sampler *s, int max_records, int64_t *time_ns, int64_t *duration_ns,
                     int32_t *slot, double *value, float *quality, uint8_t *validity) {
    pthread_mutex_lock(&s->mu);
    if (!s->nslots) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    int ticks = max_records / s->nslots;
    if (ticks > s->count) ticks = s->count;
    int out = 0;
    memset(validity, 0, ((size_t)ticks * s->nslots + 7) / 8);
    for (int t = 0; t < ticks; t++) {
        int idx = (s->head + t) % s->ring_ticks;
        for (int k = 0; k < s->nslots; k++, out++) {
            size_t r = (size_t)idx * s->nslots + k;
            time_ns[out] = s->r_time[idx] + s->time_offset_ns;
            duration_ns[out] = s->r_dur[idx];
            slot[out] = k;
            value[out] = s->r_value[r];
            quality[out] = s->r_quality[r];
            if (s->r_valid[r]) validity[out / 8] |= (uint8_t)(1u << (out % 8));
        }
    }
    s->head = (s->head + ticks) % s->ring_ticks;
    s->count -= ticks;
    pthread_mutex_unlock(&s->mu);
    return out;
}

int cp_sampler_watch_schedstats(cp_sampler *s, int n, const int *fds, int every_ticks) {
    if (every_ticks < 1 || n < 0 || n > CP_SCHED_WATCH || (n > 0 && !fds)) return -EINVAL;
    pthread_mutex_lock(&s->mu);
    int32_t first = s->sched_epoch + 1;
    for (int i = 0; i < n; i++) {
        s->sched_fd[i] = fds[i] < 0 ? -1 : fds[i];
        s->sched_epoch_of[i] = first + i;
        s->sched_last_epoch[i] = 0;         /* a new watch's first reading is its baseline */
    }
    s->sched_n = n;
    s->sched_epoch = first + (n > 0 ? n - 1 : 0);
    s->sched_every = s->sched_left = every_ticks;
    pthread_mutex_unlock(&s->mu);
    return first;
}

int cp_sampler_watch_schedstat(cp_sampler *s, int fd, int every_ticks) {
    return cp_sampler_watch_schedstats(s, fd < 0 ? 0 : 1, &fd, every_ticks);
}

int cp_sampler_drain_schedstat(cp_sampler *s, int max, int64_t *time_ns, int64_t *run_ns,
                               int64_t *wait_ns, int32_t *epoch) {
    pthread_mutex_lock(&s->mu);
    int n = s->sched_count < max ? s->sched_count : max;
    for (int i = 0; i < n; i++) {
        int idx = (s->sched_head + i) % CP_SCHED_RING;
        time_ns[i] = s->sched_time[idx] + s->time_offset_ns;
        run_ns[i] = s->sched_run[idx];
        wait_ns[i] = s->sched_wait[idx];
        epoch[i] = s->sched_tag[idx];
    }
    s->sched_head = (s->sched_head + n) % CP_SCHED_RING;
    s->sched_count -= n;
    pthread_mutex_unlock(&s->mu);
    return n < 0 ? 0 : n;
}

int cp_sampler_add_rider(cp_sampler *s, int (*fn)(void *arg, int64_t now_ns), void *arg, int every_ticks) {
    if (!fn || every_ticks < 1) return -EINVAL;
    pthread_mutex_lock(&s->rider_mu);
    int rc;
    if (s->nriders == CP_MAX_RIDERS) {
        rc = -ENOSPC;
    } else {
        rc = ++s->rider_ids;
        s->riders[s->nriders++] = (struct cp_rider){.id = rc, .every = every_ticks, .left = every_ticks,
                                                    .fn = fn, .arg = arg};
    }
    pthread_mutex_unlock(&s->rider_mu);
    return rc;
}

int cp_sampler_remove_rider(cp_sampler *s, int id) {
    pthread_mutex_lock(&s->rider_mu);   /* waits for a call in progress */
    int rc = -ENOENT;
    for (int i = 0; i < s->nriders; i++) {
        if (s->riders[i].id != id) continue;
        memmove(&s->riders[i], &s->riders[i + 1], (size_t)(s->nriders - i - 1) * sizeof(s->riders[0]));
        s->nriders--;
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&s->rider_mu);
    return rc;
}

int cp_sampler_ride_procstat(cp_sampler *s, cp_procstat *h, int every_ticks) {
    return cp_sampler_add_rider(s, cp_procstat_tick, h, every_ticks);
}

int cp_sampler_ride_threads(cp_sampler *s, cp_threads *h, int every_ticks) {
    return cp_sampler_add_rider(s, cp_threads_tick, h, every_ticks);
}

void cp_sampler_set_spill(cp_sampler *s, cp_spill *sp) {
    pthread_mutex_lock(&s->mu);
    s->spill = sp;
    pthread_mutex_unlock(&s->mu);
}

cp_spill *cp_sampler_spill(cp_sampler *s) { return s->spill; }

void cp_sampler_set_time_offset(cp_sampler *s, int64_t offset_ns) {
    pthread_mutex_lock(&s->mu);
    s->time_offset_ns = offset_ns;
    pthread_mutex_unlock(&s->mu);
}

int cp_sampler_slot_stats(cp_sampler *s, int slot, struct cp_slot_stats *out) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (!s->slot_stats || slot < 0 || slot >= s->nslots) rc = -EINVAL;
    else *out = s->slot_stats[slot];
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void cp_sampler_get_stats(cp_sampler *s, struct cp_sampler_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

void cp_sampler_free(cp_sampler *s) {
    if (!s) return;
    if (s->thread_started) {
        cp_sampler_stop(s);
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->rider_mu);
        pthread_cond_destroy(&s->cond);
        pthread_cond_destroy(&s->done);
    }
    for (int g = 0; g < s->ngroups; g++) {
        free(s->groups[g].slots);
        free(s->groups[g].prev);
        free(s->groups[g].cur);
    }
    free(s->groups);
    free(s->acc);
    free(s->slot_stats);
    free(s->r_time);
    free(s->r_dur);
    free(s->r_value);
    free(s->r_quality);
    free(s->r_valid);
    free(s);
}

/* ---- paused child ------------------------------------------------------------------- */

int cp_spawn_paused(char *const argv[], char *const envp[], int *pid, int *go_fd, int *status_fd) {
    int go[2], st[2];
    if (pipe2(go, O_CLOEXEC) < 0) return -errno;
    if (pipe2(st, O_CLOEXEC) < 0) {
        int e = errno;
        close(go[0]);
        close(go[1]);
        return -e;
    }
    pid_t child = fork();
    if (child < 0) {
        int e = errno;
        close(go[0]);
        close(go[1]);
        close(st[0]);
        close(st[1]);
        return -e;
    }
    if (child == 0) {
        /* Only async-signal-safe calls from here on. */
        char byte;
        ssize_t n;
        close(go[1]);
        close(st[0]);
        /* Python ignores SIGPIPE and SIGXFSZ; restore the defaults like subprocess does,
         * and unblock what the profiler blocked to receive signals synchronously. */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGXFSZ, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        do {
            n = read(go[0], &byte, 1);
        } while (n < 0 && errno == EINTR);
        if (n != 1) _exit(255);   /* the profiler gave up before the start */
        if (envp) execvpe(argv[0], argv, envp);
        else execvp(argv[0], argv);
        int e = errno;
        ssize_t w = write(st[1], &e, sizeof(e));
        (void)w;
        _exit(e == ENOENT ? 127 : 126);
    }
    close(go[0]);
    close(st[1]);
    *pid = child;
    *go_fd = go[1];
    *status_fd = st[0];
    return 0;
}
