/* /proc readers for the host collector.
 *
 * Why C: an in-process workload (the context manager) shares the GIL with the host
 * collector's thread, and a Python-level sample opens and reads a dozen /proc files,
 * handing the GIL back and forth around each syscall. One cffi call per sample does
 * the same reads with the GIL released once. `proc` is the procfs mount point, so
 * tests can point it at a fake tree.
 */
#define _GNU_SOURCE
#include "counterprof_native.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

/* Whole small file into buf (NUL-terminated); bytes read or -errno. */
static int read_small(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return -e;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (int)got;
}

/* The value after "key:" in a "key: value" line of a status/io/meminfo-style file. */
static int field_u64(const char *text, const char *key, uint64_t *out) {
    size_t klen = strlen(key);
    const char *line = text;
    while (line && *line) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
            const char *p = line + klen + 1;
            while (*p == ' ' || *p == '\t') p++;
            *out = strtoull(p, NULL, 10);
            return 1;
        }
        const char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    return 0;
}

/* Re-read an open /proc file from the start: procfs regenerates it on every read, so
 * one pread replaces open + read + close. */
static int pread_small(int fd, char *buf, size_t size) {
    ssize_t n;
    do {
        n = pread(fd, buf, size - 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    buf[n] = '\0';
    return (int)n;
}

struct pid_stack {
    int *v;
    size_t n, cap;
};

static int push(struct pid_stack *s, int pid) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        int *v = realloc(s->v, cap * sizeof(int));
        if (!v) return -ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = pid;
    return 0;
}

static int push_pids(const char *text, struct pid_stack *stack);

/* Children of every thread of pid, from /proc/PID/task/TID/children. */
static int push_children(const char *proc, int pid, struct pid_stack *stack) {
    char path[512], buf[8192];
    snprintf(path, sizeof(path), "%s/%d/task", proc, pid);
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL && rc == 0) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        snprintf(path, sizeof(path), "%s/%d/task/%s/children", proc, pid, e->d_name);
        if (read_small(path, buf, sizeof(buf)) <= 0) continue;
        rc = push_pids(buf, stack);
    }
    closedir(d);
    return rc;
}

/* Fields of one process: 1 if counted, 2 if a zombie (only its CPU time counted), 0 if gone.
 * A zombie keeps its CPU time until its parent reaps it and adds it to the parent's cutime:
 * dropping it meanwhile would make the tree's total dip and then count it twice. */
static int add_stat(const char *stat, struct cp_tree_stats *out, long tick, long page) {
    /* fields after the command's closing parenthesis, starting at field 3 (state) */
    const char *p = strrchr(stat, ')');
    if (!p || !p[1] || !p[2]) return 0;
    p += 2;
    if (*p == 'X') return 0;
    int zombie = *p == 'Z';
    unsigned long long f[22] = {0};   /* f[i] = field i + 3 */
    int nf = 1;
    while (*p && *p != ' ') p++;
    char *end;
    while (*p && nf < 22) {
        f[nf++] = strtoull(p, &end, 10);
        if (end == p) break;
        p = end;
    }
    if (nf < 22) return 0;
    /* utime 14, stime 15, cutime 16, cstime 17 (cutime: reaped children, whose time
     * left the live tree with them), num_threads 20, rss 24 (pages) */
    out->user_s += (double)(f[11] + f[13]) / (double)tick;
    out->system_s += (double)(f[12] + f[14]) / (double)tick;
    if (zombie) return 2;
    out->threads += (uint32_t)f[17];
    out->rss_bytes += f[21] * (uint64_t)page;
    out->processes++;
    return 1;
}

static void add_io(const char *io, struct cp_tree_stats *out) {
    uint64_t v;
    if (field_u64(io, "read_bytes", &v)) out->read_bytes += v;
    if (field_u64(io, "write_bytes", &v)) out->write_bytes += v;
}

/* /proc/PID/schedstat: "on-CPU ns, run-queue wait ns, timeslices" (of the main thread) */
static void add_schedstat(const char *text, struct cp_tree_stats *out) {
    char *p;
    strtoull(text, &p, 10);
    out->run_delay_s += (double)strtoull(p, NULL, 10) / 1e9;
}

static void add_status(const char *status, struct cp_tree_stats *out) {
    uint64_t v;
    if (field_u64(status, "voluntary_ctxt_switches", &v)) out->ctx_voluntary += v;
    if (field_u64(status, "nonvoluntary_ctxt_switches", &v)) out->ctx_involuntary += v;
}

/* A descendant's files, held open between samples while it stays in the tree (within a budget:
 * in-process they are the workload's descriptors). fd -1: not open. */
enum { PF_STAT, PF_IO, PF_STATUS, PF_SCHED, PF_CHILDREN, PF_N };
struct pfiles {
    int pid;
    uint32_t seen;                /* the walk generation that last read it */
    int fd[PF_N];
};

/* The root's files and the system files stay open between samples (pread from 0); so do the
 * descendants', while they last (a dead process's file reads nothing: it is read by path then). */
struct cp_procstat {
    char proc[256];
    int root;
    int root_stat, root_io, root_status, root_sched;   /* -1 when not opened */
    int sys_stat, sys_meminfo;
    long tick, page;
    int root_children;            /* the root's main thread's children, kept open */
    /* Every thread's children are listed once a second (a full walk); between, each process's
     * main thread's, plus the children the last full walk found (a child of another thread,
     * listed once, is read every sample until it goes: a process must never drop out of the
     * tree's total and come back, or its CPU would count twice). */
    int64_t last_full_ns;
    uint32_t root_threads;        /* the root's thread count at the last full walk */
    int force_full;
    struct pid_stack known_parent, known_child;
    /* cp_procstat_record's state: the previous sample and the rows not drained yet */
    int64_t time_offset_ns, prev_ns;
    int have_prev, root_gone;
    struct cp_tree_stats prev_tree;
    struct cp_system_stats prev_sys;
    /* /proc/stat and /proc/meminfo cost most of a record (the kernel builds all of /proc/stat
     * per read): the system figures are read once per system_period_ns (0: every record) */
    int64_t system_period_ns, prev_sys_ns;
    /* /proc/PID/status (1.4 KB, the costliest file of a walk: ~24 us on a 100 ms tick here)
     * only for its context switches: read with the system figures, not on every record */
    int skip_status;
    size_t nrows, cap;
    int64_t *r_time, *r_duration;   /* r_duration < 0: none (a gauge) */
    int32_t *r_metric;
    double *r_value;
    /* record (on the perf sampler's tick, or the host thread) vs drain (the host thread) */
    pthread_mutex_t mu;
    int tick_error;               /* the first error of a record on the tick, until read */
    struct pfiles *pf;
    size_t npf, cap_pf;
    uint32_t gen;
    int held_fds, max_fds;
    cp_spill *spill;              /* riding perf's tick with a spill: rows added to it too */
};

static int open_ro(const char *proc, int pid, const char *name) {
    char path[512];
    if (pid > 0) snprintf(path, sizeof(path), "%s/%d/%s", proc, pid, name);
    else snprintf(path, sizeof(path), "%s/%s", proc, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

cp_procstat *cp_procstat_open(const char *proc, int root, int *err) {
    cp_procstat *h = calloc(1, sizeof(*h));
    if (!h) {
        *err = -ENOMEM;
        return NULL;
    }
    snprintf(h->proc, sizeof(h->proc), "%s", proc);
    h->root = root;
    h->tick = sysconf(_SC_CLK_TCK);
    h->page = sysconf(_SC_PAGESIZE);
    h->root_stat = h->root_io = h->root_status = h->root_sched = h->root_children = -1;
    h->force_full = 1;
    pthread_mutex_init(&h->mu, NULL);
    /* descendants' files are held only on procfs, whose files of a dead process read nothing
     * (a test's fake tree keeps a deleted file's text); an eighth of the descriptor limit at most */
    struct rlimit rl;
    struct statfs fs;
    h->max_fds = statfs(proc, &fs) == 0 && fs.f_type == 0x9fa0 /* PROC_SUPER_MAGIC */ ? 256 : 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (long)(rl.rlim_cur / 8) < h->max_fds)
        h->max_fds = (int)(rl.rlim_cur / 8);
    h->sys_stat = open_ro(proc, 0, "stat");
    h->sys_meminfo = open_ro(proc, 0, "meminfo");
    if (h->sys_stat < 0 || h->sys_meminfo < 0) {
        *err = h->sys_stat < 0 ? h->sys_stat : h->sys_meminfo;
        cp_procstat_close(h);
        return NULL;
    }
    if (root > 0) {
        h->root_stat = open_ro(proc, root, "stat");
        h->root_io = open_ro(proc, root, "io");
        h->root_status = open_ro(proc, root, "status");
        h->root_sched = open_ro(proc, root, "schedstat");
        char name[64];
        snprintf(name, sizeof(name), "task/%d/children", root);
        h->root_children = open_ro(proc, root, name);
    }
    *err = 0;
    return h;
}

void cp_procstat_close(cp_procstat *h) {
    if (!h) return;
    int fds[] = {h->root_stat, h->root_io, h->root_status, h->root_sched, h->root_children,
                 h->sys_stat, h->sys_meminfo};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0) close(fds[i]);
    for (size_t i = 0; i < h->npf; i++)
        for (int k = 0; k < PF_N; k++)
            if (h->pf[i].fd[k] >= 0) close(h->pf[i].fd[k]);
    free(h->pf);
    free(h->known_parent.v);
    free(h->known_child.v);
    free(h->r_time);
    free(h->r_duration);
    free(h->r_metric);
    free(h->r_value);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static struct pfiles *pf_get(cp_procstat *h, int pid) {
    for (size_t i = 0; i < h->npf; i++)
        if (h->pf[i].pid == pid) {
            h->pf[i].seen = h->gen;
            return &h->pf[i];
        }
    if (h->npf == h->cap_pf) {
        size_t cap = h->cap_pf ? h->cap_pf * 2 : 16;
        struct pfiles *v = realloc(h->pf, cap * sizeof(*v));
        if (!v) return NULL;
        h->pf = v;
        h->cap_pf = cap;
    }
    struct pfiles *e = &h->pf[h->npf++];
    e->pid = pid;
    e->seen = h->gen;
    for (int k = 0; k < PF_N; k++) e->fd[k] = -1;
    return e;
}

/* A descendant's file: through its held descriptor (opened now within the budget), else by path.
 * A descriptor that reads nothing belonged to a process now gone: the path says what is there. */
static int pf_read(cp_procstat *h, int pid, int which, char *buf, size_t size) {
    static const char *const names[PF_N] = {"stat", "io", "status", "schedstat", NULL};
    char path[512];
    if (which == PF_CHILDREN) snprintf(path, sizeof(path), "%s/%d/task/%d/children", h->proc, pid, pid);
    else snprintf(path, sizeof(path), "%s/%d/%s", h->proc, pid, names[which]);
    struct pfiles *e = pf_get(h, pid);
    if (e && e->fd[which] >= 0) {
        int n = pread_small(e->fd[which], buf, size);
        if (n > 0) return n;
        close(e->fd[which]);
        e->fd[which] = -1;
        h->held_fds--;
        return read_small(path, buf, size);
    }
    if (e && h->held_fds < h->max_fds) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return -errno;
        e->fd[which] = fd;
        h->held_fds++;
        return pread_small(fd, buf, size);
    }
    return read_small(path, buf, size);
}

/* After a sample: the files of processes no longer in the tree are closed; with pid > 0, only
 * that process's (gone mid-walk: its files now read nothing). */
static void pf_prune(cp_procstat *h, int pid) {
    for (size_t i = 0; i < h->npf;) {
        if (pid > 0 ? h->pf[i].pid != pid : h->pf[i].seen == h->gen) {
            i++;
            continue;
        }
        for (int k = 0; k < PF_N; k++)
            if (h->pf[i].fd[k] >= 0) {
                close(h->pf[i].fd[k]);
                h->held_fds--;
            }
        h->pf[i] = h->pf[--h->npf];
    }
}

/* Pids in a children file's text onto the stack. */
static int push_pids(const char *text, struct pid_stack *stack) {
    for (const char *p = text; *p;) {
        while (*p == ' ' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        int pid = (int)strtol(p, &end, 10);
        if (end == p) break;
        int rc = push(stack, pid);
        if (rc) return rc;
        p = end;
    }
    return 0;
}

/* The children of pid a walk follows: every thread's (full), else its main thread's and those
 * the last full walk found, once each. A full walk records what it found. */
static int walk_children(cp_procstat *h, int pid, int full, struct pid_stack *stack) {
    size_t mark = stack->n;
    if (full) {
        int rc = push_children(h->proc, pid, stack);
        for (size_t i = mark; rc == 0 && i < stack->n; i++) {
            rc = push(&h->known_parent, pid);
            if (rc == 0) rc = push(&h->known_child, stack->v[i]);
        }
        return rc;
    }
    char buf[8192];
    int got;
    if (pid == h->root && h->root_children >= 0) {
        got = pread_small(h->root_children, buf, sizeof(buf));
    } else {
        got = pf_read(h, pid, PF_CHILDREN, buf, sizeof(buf));
    }
    int rc = got > 0 ? push_pids(buf, stack) : 0;
    size_t fresh = stack->n;
    for (size_t k = 0; rc == 0 && k < h->known_parent.n; k++) {
        if (h->known_parent.v[k] != pid) continue;
        int child = h->known_child.v[k], seen = 0;
        for (size_t i = mark; i < fresh && !seen; i++) seen = stack->v[i] == child;
        if (!seen) rc = push(stack, child);
    }
    return rc;
}

/* One walk of the tree. Each process's children are listed before its stat is read: a child
 * reaped before that read is in the parent's cutime, one reaped after it is read itself --
 * unless it is reaped between the two reads, in which case its stat is gone when its turn
 * comes: *vanished is set and the caller walks again (fully: the known children changed). */
static int walk_tree(cp_procstat *h, struct cp_tree_stats *out, int *vanished, int full) {
    memset(out, 0, sizeof(*out));
    *vanished = 0;
    if (full) h->known_parent.n = h->known_child.n = 0;
    char buf[4096];
    struct pid_stack stack = {0};
    int rc = walk_children(h, h->root, full, &stack);
    if (rc < 0 || pread_small(h->root_stat, buf, sizeof(buf)) <= 0 ||
        add_stat(buf, out, h->tick, h->page) != 1) {
        free(stack.v);
        memset(out, 0, sizeof(*out));
        return rc < 0 ? rc : 0;                     /* root exited: root_alive stays 0 */
    }
    out->root_alive = 1;
    if (full) h->root_threads = out->threads;
    else if (out->threads != h->root_threads) h->force_full = 1;   /* new threads: list them next */
    if (h->root_io >= 0 && pread_small(h->root_io, buf, sizeof(buf)) > 0) add_io(buf, out);
    if (!h->skip_status && h->root_status >= 0 && pread_small(h->root_status, buf, sizeof(buf)) > 0)
        add_status(buf, out);
    if (h->root_sched >= 0 && pread_small(h->root_sched, buf, sizeof(buf)) > 0) add_schedstat(buf, out);
    while (rc == 0 && stack.n > 0) {
        int pid = stack.v[--stack.n];
        size_t mark = stack.n;
        rc = walk_children(h, pid, full, &stack);
        if (rc < 0) break;
        int counted = pf_read(h, pid, PF_STAT, buf, sizeof(buf)) > 0 ? add_stat(buf, out, h->tick, h->page) : 0;
        if (!counted) {                             /* reaped since it was listed */
            pf_prune(h, pid);                       /* its files now read nothing */
            *vanished = 1;
            stack.n = mark;                         /* its orphans are no longer ours */
            continue;
        }
        /* a zombie's I/O also moves to its parent when reaped (its ctx switches do not) */
        if (pf_read(h, pid, PF_IO, buf, sizeof(buf)) > 0) add_io(buf, out);
        if (counted == 2) continue;
        if (!h->skip_status && pf_read(h, pid, PF_STATUS, buf, sizeof(buf)) > 0) add_status(buf, out);
        if (pf_read(h, pid, PF_SCHED, buf, sizeof(buf)) > 0) add_schedstat(buf, out);
    }
    free(stack.v);
    return rc;
}

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A process reaped mid-walk would be in neither its own stat nor its parent's cutime: the
 * total would dip and the next sample count it again. Such a walk is taken again, fully (3
 * times at most: a tree that reaps that fast keeps the last walk). */
static int cp_procstat_tree(cp_procstat *h, struct cp_tree_stats *out) {
    memset(out, 0, sizeof(*out));
    if (h->root <= 0 || h->root_stat < 0) return 0;
    int64_t now = monotonic_ns();
    int full = h->force_full || now - h->last_full_ns >= 1000000000LL;
    h->gen++;
    for (int attempt = 0;; attempt++) {
        int vanished = 0;
        if (full) {
            h->force_full = 0;
            h->last_full_ns = now;
        }
        int rc = walk_tree(h, out, &vanished, full);
        if (rc < 0 || !vanished || attempt == 3) {
            pf_prune(h, -1);
            return rc;
        }
        full = 1;
    }
}

static int cp_procstat_system(cp_procstat *h, struct cp_system_stats *out) {
    memset(out, 0, sizeof(*out));
    char buf[16384];
    int n = pread_small(h->sys_stat, buf, sizeof(buf));
    if (n < 0) return n;
    /* cpu  user nice system idle iowait irq softirq steal guest guest_nice (USER_HZ);
     * guest time is already inside user, so it is not added again */
    if (strncmp(buf, "cpu ", 4) != 0) return -EINVAL;
    unsigned long long v[8] = {0};
    char *p = buf + 4;
    for (int i = 0; i < 8; i++) v[i] = strtoull(p, &p, 10);
    uint64_t total = 0;
    for (int i = 0; i < 8; i++) total += v[i];
    out->cpu_total_s = (double)total / (double)h->tick;
    out->cpu_idle_s = (double)v[3] / (double)h->tick;
    out->cpu_iowait_s = (double)v[4] / (double)h->tick;

    n = pread_small(h->sys_meminfo, buf, sizeof(buf));
    if (n < 0) return n;
    uint64_t kb;
    if (field_u64(buf, "MemTotal", &kb)) out->mem_total_bytes = kb * 1024;
    if (field_u64(buf, "MemAvailable", &kb)) out->mem_available_bytes = kb * 1024;
    return 0;
}

int cp_procstat_sample(cp_procstat *h, struct cp_tree_stats *tree, struct cp_system_stats *sys) {
    int rc = cp_procstat_tree(h, tree);
    if (rc < 0) return rc;
    return cp_procstat_system(h, sys);
}

/* ---- every process's CPU (the threads collector's contenders) ---------------------------- */

/* One /proc/PID/stat: ppid, utime+stime, start ticks and comm; 0, or -1 if it is not one. */
static int parse_process_stat(const char *stat, int32_t *ppid, int64_t *cpu, int64_t *start, char *comm) {
    const char *open_paren = strchr(stat, '('), *p = strrchr(stat, ')');
    if (!open_paren || !p || p < open_paren || !p[1] || !p[2]) return -1;
    size_t len = (size_t)(p - open_paren - 1);
    memset(comm, 0, 16);
    memcpy(comm, open_paren + 1, len > 15 ? 15 : len);
    p += 2;                                 /* field 3, the state */
    unsigned long long f[23] = {0};         /* f[i]: field i */
    char *end;
    for (int field = 4; field <= 22; field++) {
        while (*p && *p != ' ') p++;
        while (*p == ' ') p++;
        if (!*p) return -1;
        f[field] = strtoull(p, &end, 10);
        if (end == p) return -1;
    }
    *ppid = (int32_t)f[4];
    *cpu = (int64_t)(f[14] + f[15]);
    *start = (int64_t)f[22];
    return 0;
}

int cp_process_table(const char *proc, int cap, int32_t *pid, int64_t *start_ticks, int32_t *ppid,
                     int64_t *cpu_ticks, char *comm) {
    int dfd = open(proc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -errno;
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return -e;
    }
    int n = 0;
    struct dirent *e;
    char path[64], buf[1024];
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char *tail;
        long p = strtol(e->d_name, &tail, 10);
        if (*tail || p <= 0 || p > INT32_MAX) continue;
        snprintf(path, sizeof(path), "%s/stat", e->d_name);
        int fd = openat(dfd, path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;               /* exited since it was listed */
        ssize_t got = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (got <= 0) continue;
        buf[got] = '\0';
        int32_t pp;
        int64_t cpu, start;
        char name[16];
        if (parse_process_stat(buf, &pp, &cpu, &start, name) != 0) continue;
        if (n < cap) {
            pid[n] = (int32_t)p;
            ppid[n] = pp;
            cpu_ticks[n] = cpu;
            start_ticks[n] = start;
            memcpy(comm + (size_t)n * 16, name, 16);
        }
        n++;
    }
    closedir(d);
    return n;
}

/* ---- thread states of a tree (the threads collector) ------------------------------------ */

#include <time.h>

struct tslot {
    struct cp_thread pub;
    uint64_t run_ns, wait_ns;      /* schedstat at the last sample */
    int sched_fd, children_fd;     /* -1: not held (over the budget): opened when read */
    int stat_fd;                   /* a process's main thread: /proc/PID/stat */
    int group_start, group_n;      /* a process's main thread: its process's threads in the array */
    int role;                      /* CP_ROLE_*, set by Python (cp_threads_set_roles); -1 unknown */
};

/* One walk taken on the perf sampler's tick, summed by role. */
struct walk_row {
    int64_t time_ns, duration_ns;
    double run_s[CP_ROLES], wait_s[CP_ROLES];
    int32_t intraop, loader_workers;
};

struct cp_threads {
    char proc[256];
    int root, root_stat;
    /* the root's stat as this walk's start read it (NULL outside a walk): its gather reads no
     * second copy (~5 us a walk) */
    const char *root_stat_now;
    int root_stat_len;
    long tick;
    int max_fds, held_fds;
    struct tslot *slots, *next;    /* this sample's threads; the ones being gathered */
    int n, cap, next_n, next_cap;
    int *index;                    /* open addressing tid -> slot in `slots`; -1 empty */
    int index_cap;
    uint8_t *taken;                /* slots[i] carried into `next` */
    struct cp_thread *pub;
    double last_s, last_full_s;    /* CLOCK_BOOTTIME at the previous (full) sample's start; < 0 before */
    /* walks on the perf sampler's tick (cp_threads_tick) vs Python's drain: under mu */
    pthread_mutex_t mu;
    int wake_fd;                   /* eventfd: a kept walk, a stop */
    int64_t offset_ns, tick_ns, walk_ns, big_walk_ns, full_every_ns;
    int small_up_to;
    int64_t last_walk_mono, last_full_mono;
    int kept, error, loader_workers;
    struct cp_threads_stats kept_stats;
    int64_t kept_time, kept_duration;
    int children_fd, children_len;
    char children_seen[4096];
    struct walk_row *rows;
    int nrows, rows_cap;
    cp_spill *spill;               /* riding perf's tick with a spill: walk rows added to it too */
};

/* What one sample needs to know while it walks. */
struct walk {
    double now, interval;
    double born_after;             /* a thread first seen in a known process counts from birth if born since */
    double full_born_after;        /* the same for processes found through other threads' children */
    int full;
};

static double boottime_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* a held descriptor when the budget allows, else -1 (the file is then opened when read) */
static int hold(cp_threads *h, const char *path) {
    if (h->held_fds >= h->max_fds) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) h->held_fds++;
    return fd;
}

static void release(cp_threads *h, struct tslot *s) {
    int *fds[] = {&s->sched_fd, &s->children_fd, &s->stat_fd};
    for (size_t i = 0; i < 3; i++)
        if (*fds[i] >= 0) {
            close(*fds[i]);
            h->held_fds--;
            *fds[i] = -1;
        }
}

/* /proc/PID/task/TID/<name> through its held descriptor, or opened for this read */
static int read_task_file(const cp_threads *h, int fd, int pid, int tid, const char *name,
                          char *buf, size_t size) {
    if (fd >= 0) return pread_small(fd, buf, size);
    char path[512];
    snprintf(path, sizeof(path), "%s/%d/task/%d/%s", h->proc, pid, tid, name);
    return read_small(path, buf, size);
}

static int parse_schedstat(const char *text, uint64_t *run, uint64_t *wait) {
    char *p;
    *run = strtoull(text, &p, 10);
    if (p == text) return -1;
    *wait = strtoull(p, NULL, 10);
    return 0;
}

/* Fields of a stat line: state (3), num_threads (20), starttime (22, ticks since boot), comm (2).
 * 0, or -1 when it does not parse. */
static int parse_stat(const char *stat, char *state, long *threads, double *start_ticks, char *comm) {
    const char *open_paren = strchr(stat, '('), *p = strrchr(stat, ')');
    if (!open_paren || !p || !p[1] || !p[2]) return -1;
    if (comm) {
        size_t len = (size_t)(p - open_paren - 1);
        if (len > 15) len = 15;
        memcpy(comm, open_paren + 1, len);
        comm[len] = '\0';
    }
    p += 2;
    *state = *p;
    char *end;
    for (int field = 3; field < 22; field++) {         /* p is at field `field` */
        while (*p && *p != ' ') p++;
        while (*p == ' ') p++;
        if (!*p) return -1;
        if (field + 1 == 20) *threads = strtol(p, NULL, 10);
    }
    *start_ticks = (double)strtoull(p, &end, 10);
    return end == p ? -1 : 0;
}

static void read_comm(const cp_threads *h, int pid, int tid, char *comm) {
    char buf[64];
    if (read_task_file(h, -1, pid, tid, "comm", buf, sizeof(buf)) <= 0) return;   /* keep the last name */
    buf[strcspn(buf, "\n")] = '\0';
    snprintf(comm, 16, "%s", buf);
}

static int index_find(const cp_threads *h, int tid) {
    if (!h->index_cap) return -1;
    unsigned mask = (unsigned)h->index_cap - 1;
    for (unsigned i = ((unsigned)tid * 2654435761u) & mask;; i = (i + 1) & mask) {
        int at = h->index[i];
        if (at < 0) return -1;
        if (h->slots[at].pub.tid == tid) return at;
    }
}

static int index_build(cp_threads *h) {
    int want = 16;
    while (want < 2 * h->n) want *= 2;
    if (want != h->index_cap) {
        int *v = realloc(h->index, (size_t)want * sizeof(int));
        if (!v) return -ENOMEM;
        h->index = v;
        h->index_cap = want;
    }
    memset(h->index, 0xff, (size_t)want * sizeof(int));
    unsigned mask = (unsigned)want - 1;
    for (int k = 0; k < h->n; k++) {
        unsigned i = ((unsigned)h->slots[k].pub.tid * 2654435761u) & mask;
        while (h->index[i] >= 0) i = (i + 1) & mask;
        h->index[i] = k;
    }
    return 0;
}

static struct tslot *next_slot(cp_threads *h) {
    if (h->next_n == h->next_cap) {
        int cap = h->next_cap ? h->next_cap * 2 : 64;
        struct tslot *v = realloc(h->next, (size_t)cap * sizeof(*v));
        if (!v) return NULL;
        h->next = v;
        h->next_cap = cap;
    }
    return &h->next[h->next_n++];
}

cp_threads *cp_threads_open(const char *proc, int root, int max_fds, int *err) {
    cp_threads *h = calloc(1, sizeof(*h));
    if (!h) {
        *err = -ENOMEM;
        return NULL;
    }
    snprintf(h->proc, sizeof(h->proc), "%s", proc);
    h->root = root;
    h->tick = sysconf(_SC_CLK_TCK);
    h->max_fds = max_fds > 1 ? max_fds - 1 : 0;   /* one for the root's stat */
    h->last_s = h->last_full_s = -1;
    h->children_fd = -1;
    h->root_stat = open_ro(proc, root, "stat");
    if (h->root_stat < 0) {
        *err = h->root_stat;
        free(h);
        return NULL;
    }
    h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (h->wake_fd < 0) {
        *err = -errno;
        close(h->root_stat);
        free(h);
        return NULL;
    }
    pthread_mutex_init(&h->mu, NULL);
    *err = 0;
    return h;
}

void cp_threads_close(cp_threads *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) release(h, &h->slots[i]);
    if (h->root_stat >= 0) close(h->root_stat);
    close(h->wake_fd);
    pthread_mutex_destroy(&h->mu);
    free(h->rows);
    free(h->slots);
    free(h->next);
    free(h->index);
    free(h->taken);
    free(h->pub);
    free(h);
}

/* A known thread (slots[at]) into h->next with this interval's deltas; 1 if renamed (names are
 * re-read on full samples), 0, or -1 when its schedstat is gone (nothing changed then). */
static int carry_thread(cp_threads *h, int at, int ppid, const struct walk *w) {
    struct tslot *old = &h->slots[at];
    char buf[256];
    uint64_t run, wait;
    if (read_task_file(h, old->sched_fd, old->pub.pid, old->pub.tid, "schedstat", buf, sizeof(buf)) <= 0 ||
        parse_schedstat(buf, &run, &wait) != 0)
        return -1;
    struct tslot *s = next_slot(h);
    if (!s) return -ENOMEM;
    h->taken[at] = 1;
    *s = *old;
    s->pub.ppid = ppid;
    s->pub.fresh = 0;
    /* never negative: a tid reused in between reads as a smaller count */
    s->pub.run_s = run > old->run_ns ? (double)(run - old->run_ns) / 1e9 : 0.0;
    s->pub.wait_s = wait > old->wait_ns ? (double)(wait - old->wait_ns) / 1e9 : 0.0;
    s->pub.life_s = w->interval;
    s->run_ns = run;
    s->wait_ns = wait;
    if (w->full && s->pub.tid != s->pub.pid) {
        char before[16];
        memcpy(before, s->pub.comm, sizeof(before));
        read_comm(h, s->pub.pid, s->pub.tid, s->pub.comm);
        return memcmp(before, s->pub.comm, sizeof(before)) != 0;
    }
    return 0;
}

/* A thread first seen (or whose descriptor outlived it): 1, -1 if gone, -ENOMEM. */
static int new_thread(cp_threads *h, int pid, int ppid, int tid, double born_after, const struct walk *w) {
    char path[512], buf[4096];
    uint64_t run, wait;
    snprintf(path, sizeof(path), "%s/%d/task/%d/schedstat", h->proc, pid, tid);
    struct tslot fresh = {.sched_fd = hold(h, path), .children_fd = -1, .stat_fd = -1, .role = -1};
    if (read_task_file(h, fresh.sched_fd, pid, tid, "schedstat", buf, sizeof(buf)) <= 0 ||
        parse_schedstat(buf, &run, &wait) != 0) {
        release(h, &fresh);
        return -1;
    }
    fresh.pub = (struct cp_thread){.tid = tid, .pid = pid, .ppid = ppid, .fresh = 1, .life_s = w->interval};
    char state;
    long nthreads;
    double born = -1;
    if (read_task_file(h, -1, pid, tid, "stat", buf, sizeof(buf)) <= 0 ||
        parse_stat(buf, &state, &nthreads, &born, NULL) != 0)
        born = -1;
    else
        born /= (double)h->tick;
    if (born >= 0 && born_after >= 0 && born >= born_after) {
        /* born since the walk that would have seen it: its whole life is in this interval */
        fresh.pub.run_s = (double)run / 1e9;
        fresh.pub.wait_s = (double)wait / 1e9;
        double life = w->now - born;
        fresh.pub.life_s = life < 0 ? 0 : life > w->interval ? w->interval : life;
    }
    fresh.run_ns = run;
    fresh.wait_ns = wait;
    read_comm(h, pid, tid, fresh.pub.comm);
    snprintf(path, sizeof(path), "%s/%d/task/%d/children", h->proc, pid, tid);
    fresh.children_fd = hold(h, path);
    struct tslot *s = next_slot(h);
    if (!s) {
        release(h, &fresh);
        return -ENOMEM;
    }
    *s = fresh;
    return 1;
}

/* Every thread of one process into h->next, then its children onto the stack. When the
 * process's thread count is the one last seen and every known thread still reads, the task
 * directory is not listed (a thread that exits fails its read; one that is born changes the
 * count). Children are read from the main thread each sample, from the others on full ones.
 * Returns 1 if something changed, 0, or -ENOMEM. */
static int gather_process(cp_threads *h, int pid, int ppid, double born_after, const struct walk *w,
                          struct pid_stack *stack, struct pid_stack *parents, struct pid_stack *via_main) {
    char buf[8192];
    int at = index_find(h, pid);
    if (at >= 0 && h->taken[at] && h->slots[at].pub.pid == pid) return 0;   /* gathered already */
    struct tslot *main_old = at >= 0 && !h->taken[at] && h->slots[at].pub.pid == pid ? &h->slots[at] : NULL;
    int stat_fd = pid == h->root ? h->root_stat : main_old ? main_old->stat_fd : -1;
    char state, comm[16] = "";
    long nthreads = -1;
    double start;
    int n;
    if (pid == h->root && h->root_stat_now) {
        n = h->root_stat_len;
        memcpy(buf, h->root_stat_now, (size_t)n + 1);
    } else {
        n = stat_fd >= 0 ? pread_small(stat_fd, buf, sizeof(buf)) : read_task_file(h, -1, pid, pid, "stat", buf, sizeof(buf));
    }
    if (n <= 0 || parse_stat(buf, &state, &nthreads, &start, comm) != 0) return 0;   /* gone since listed */
    int changed = 0, mark = h->next_n;
    int fast = main_old && main_old->group_n == nthreads;
    if (fast) {
        for (int i = main_old->group_start; i < main_old->group_start + main_old->group_n; i++) {
            int got = h->slots[i].pub.pid == pid && !h->taken[i] ? carry_thread(h, i, ppid, w) : -1;
            if (got < -1) return got;
            if (got < 0) {                              /* one ended: list the directory after all */
                for (int k = mark; k < h->next_n; k++) h->taken[index_find(h, h->next[k].pub.tid)] = 0;
                h->next_n = mark;
                fast = 0;
                changed = 0;
                break;
            }
            changed |= got;
        }
    }
    if (!fast) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%d/task", h->proc, pid);
        DIR *d = opendir(path);
        if (!d) return 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!isdigit((unsigned char)e->d_name[0])) continue;
            int tid = atoi(e->d_name);
            int k = index_find(h, tid);
            int got = k >= 0 && !h->taken[k] && h->slots[k].pub.pid == pid ? carry_thread(h, k, ppid, w) : -1;
            if (got == -1) {
                if (k >= 0 && !h->taken[k] && h->slots[k].pub.pid == pid) {
                    h->taken[k] = 1;                    /* its descriptor outlived it: start afresh */
                    release(h, &h->slots[k]);
                }
                got = new_thread(h, pid, ppid, tid, born_after, w);
            }
            if (got < -1) {
                closedir(d);
                return got;
            }
            if (got > 0) changed = 1;
        }
        closedir(d);
    }
    /* the process's main thread keeps its stat descriptor, its name (from stat) and its range */
    for (int k = mark; k < h->next_n; k++) {
        struct tslot *s = &h->next[k];
        if (s->pub.tid != pid) continue;
        if (strcmp(s->pub.comm, comm) != 0) {
            snprintf(s->pub.comm, sizeof(s->pub.comm), "%s", comm);
            changed = 1;
        }
        if (s->stat_fd < 0 && pid != h->root) {
            snprintf(buf, sizeof(buf), "%s/%d/stat", h->proc, pid);
            s->stat_fd = hold(h, buf);
        }
        s->group_start = mark;
        s->group_n = h->next_n - mark;
    }
    for (int k = mark; k < h->next_n; k++) {
        struct tslot *s = &h->next[k];
        int is_main = s->pub.tid == pid;
        if (!is_main && !w->full) continue;
        if (read_task_file(h, s->children_fd, pid, s->pub.tid, "children", buf, sizeof(buf)) <= 0) continue;
        for (char *p = buf; *p;) {
            while (*p == ' ' || *p == '\n') p++;
            if (!*p) break;
            int child = (int)strtol(p, &p, 10);
            if (push(stack, child) || push(parents, pid) || push(via_main, is_main)) return -ENOMEM;
        }
    }
    return changed;
}

int cp_threads_sample(cp_threads *h, int full, struct cp_threads_stats *out) {
    memset(out, 0, sizeof(*out));
    double now = boottime_s();
    /* starttime is in whole ticks, rounded down: a tick of slack so no newborn is missed */
    double slack = 1.0 / (double)h->tick;
    struct walk w = {.now = now, .interval = h->last_s < 0 ? 0 : now - h->last_s,
                     .born_after = h->last_s < 0 ? -1 : h->last_s - slack,
                     .full_born_after = h->last_full_s < 0 ? -1 : h->last_full_s - slack,
                     .full = full || h->last_full_s < 0};
    h->last_s = now;
    if (w.full) h->last_full_s = now;
    free(h->taken);
    h->taken = calloc((size_t)(h->n ? h->n : 1), 1);
    if (!h->taken) return -ENOMEM;
    h->next_n = 0;
    int changed = 0, rc = 0;
    char buf[4096];

    int n = pread_small(h->root_stat, buf, sizeof(buf));
    const char *state = n > 0 ? strrchr(buf, ')') : NULL;
    int alive = state && state[1] && state[2] && state[2] != 'Z' && state[2] != 'X';
    if (n > 0) {
        h->root_stat_now = buf;
        h->root_stat_len = n;
    }
    struct pid_stack stack = {0}, parents = {0}, via_main = {0};
    if (alive && (push(&stack, h->root) || push(&parents, 0) || push(&via_main, 1))) rc = -ENOMEM;
    uint8_t *tried = calloc((size_t)(h->n ? h->n : 1), 1);
    if (!tried) rc = -ENOMEM;
    for (int again = 1; rc == 0 && again;) {
        while (rc == 0 && stack.n > 0) {
            int pid = stack.v[--stack.n], ppid = parents.v[--parents.n], main = via_main.v[--via_main.n];
            /* a process found through a thread other than the main one could have been born any
             * time since the last full sample, the last time those lists were read */
            int got = gather_process(h, pid, ppid, main ? w.born_after : w.full_born_after, &w,
                                     &stack, &parents, &via_main);
            if (got < 0) rc = got;
            else changed |= got;
        }
        /* between full samples other threads' children are not read: the processes known to be
         * children of a process gathered now are visited as they were found last time */
        again = 0;
        for (int i = 0; rc == 0 && i < h->n; i++) {
            const struct tslot *s = &h->slots[i];
            if (h->taken[i] || tried[i] || s->pub.tid != s->pub.pid || s->pub.ppid == 0) continue;
            int parent = index_find(h, s->pub.ppid);
            if (parent < 0 || !h->taken[parent]) continue;
            tried[i] = 1;
            if (push(&stack, s->pub.pid) || push(&parents, s->pub.ppid) || push(&via_main, 1)) rc = -ENOMEM;
            again = 1;
        }
    }
    h->root_stat_now = NULL;
    free(tried);
    free(stack.v);
    free(parents.v);
    free(via_main.v);
    for (int i = 0; i < h->n; i++)
        if (!h->taken[i]) {
            release(h, &h->slots[i]);
            changed = 1;
        }
    /* the gathered threads become the current ones */
    struct tslot *tmp = h->slots;
    int tmp_cap = h->cap;
    h->slots = h->next;
    h->cap = h->next_cap;
    h->n = h->next_n;
    h->next = tmp;
    h->next_cap = tmp_cap;
    h->next_n = 0;
    if (rc == 0) rc = index_build(h);
    if (rc < 0) return rc;
    free(h->pub);
    h->pub = malloc((size_t)(h->n ? h->n : 1) * sizeof(*h->pub));
    if (!h->pub) return -ENOMEM;
    for (int i = 0; i < h->n; i++) h->pub[i] = h->slots[i].pub;
    out->root_alive = alive;
    out->n = h->n;
    out->changed = changed;
    out->interval_s = w.interval;
    out->threads = h->pub;
    return 0;
}

/* ---- the threads walk on the perf sampler's tick ----------------------------------------- */

int cp_threads_ride_setup(cp_threads *h, int64_t offset_ns, int64_t last_walk_ns, int64_t tick_ns,
                          int64_t walk_ns, int64_t big_walk_ns, int small_up_to, int64_t full_every_ns) {
    if (tick_ns <= 0 || walk_ns <= 0 || big_walk_ns <= 0 || full_every_ns <= 0) return -EINVAL;
    pthread_mutex_lock(&h->mu);
    h->offset_ns = offset_ns;
    h->last_walk_mono = h->last_full_mono = last_walk_ns - offset_ns;
    h->tick_ns = tick_ns;
    h->walk_ns = walk_ns;
    h->big_walk_ns = big_walk_ns;
    h->small_up_to = small_up_to;
    h->full_every_ns = full_every_ns;
    pthread_mutex_unlock(&h->mu);
    return 0;
}

static void wake(cp_threads *h) {
    uint64_t one = 1;
    ssize_t w = write(h->wake_fd, &one, sizeof(one));
    (void)w;   /* EAGAIN: the counter is already nonzero, Python wakes anyway */
}

void cp_threads_wake(cp_threads *h) { wake(h); }

int cp_threads_wake_fd(cp_threads *h) { return h->wake_fd; }

/* The watched children file, into children_seen; 1 if it differs from what was there. */
static int read_children(cp_threads *h) {
    if (h->children_fd < 0) return 0;
    char buf[sizeof(h->children_seen)];
    ssize_t n = pread(h->children_fd, buf, sizeof(buf), 0);
    if (n < 0) n = 0;
    int moved = n != h->children_len || memcmp(buf, h->children_seen, (size_t)n) != 0;
    memcpy(h->children_seen, buf, (size_t)n);
    h->children_len = (int)n;
    return moved;
}

static int children_moved(cp_threads *h) {
    if (h->children_fd < 0) return 0;
    char buf[sizeof(h->children_seen)];
    ssize_t n = pread(h->children_fd, buf, sizeof(buf), 0);
    if (n < 0) return 1;
    return n != h->children_len || memcmp(buf, h->children_seen, (size_t)n) != 0;
}

void cp_threads_watch_children(cp_threads *h, int fd) {
    pthread_mutex_lock(&h->mu);
    h->children_fd = fd < 0 ? -1 : fd;
    read_children(h);
    pthread_mutex_unlock(&h->mu);
}

int cp_threads_tick(void *arg, int64_t now) {
    cp_threads *h = arg;
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    if (h->kept || h->error || h->tick_ns <= 0) goto out;
    int64_t every = h->n <= h->small_up_to ? h->walk_ns : h->big_walk_ns;
    /* half a tick early: a walk every walk_ns despite the timer's jitter */
    if (now - h->last_walk_mono < every - h->tick_ns / 2 && !children_moved(h)) goto out;
    int full = now - h->last_full_mono >= h->full_every_ns;
    if (full) h->last_full_mono = now;
    struct cp_threads_stats st;
    rc = cp_threads_sample(h, full, &st);
    int64_t duration = now - h->last_walk_mono;
    h->last_walk_mono = now;
    if (rc < 0) {
        h->error = rc;
        wake(h);
        goto out;
    }
    int unknown = 0;
    for (int i = 0; i < h->n && !unknown; i++) unknown = h->slots[i].role < 0 || h->slots[i].role >= CP_ROLES;
    if (!st.root_alive || st.changed || unknown) {
        h->kept = 1;
        h->kept_stats = st;
        h->kept_time = now + h->offset_ns;
        h->kept_duration = duration;
        wake(h);
        goto out;
    }
    if (h->nrows == h->rows_cap) {
        int cap = h->rows_cap ? h->rows_cap * 2 : 64;
        struct walk_row *v = realloc(h->rows, (size_t)cap * sizeof(*v));
        if (!v) {
            h->error = rc = -ENOMEM;
            wake(h);
            goto out;
        }
        h->rows = v;
        h->rows_cap = cap;
    }
    struct walk_row *r = &h->rows[h->nrows++];
    memset(r, 0, sizeof(*r));
    r->time_ns = now + h->offset_ns;
    r->duration_ns = duration;
    r->loader_workers = h->loader_workers;
    for (int i = 0; i < h->n; i++) {
        int role = h->slots[i].role;
        r->run_s[role] += h->slots[i].pub.run_s;
        r->wait_s[role] += h->slots[i].pub.wait_s;
        r->intraop += role == CP_ROLE_INTRAOP;
    }
    if (h->spill) {
        const void *parts[1] = {r};
        uint32_t lens[1] = {sizeof(*r)};
        cp_spill_add(h->spill, CP_SPILL_WALK, 1, parts, lens);
    }
    read_children(h);
out:
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int cp_threads_set_roles(cp_threads *h, int n, const int32_t *tids, const int32_t *roles, int loader_workers) {
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < n; i++) {
        int at = index_find(h, tids[i]);
        if (at >= 0) h->slots[at].role = roles[i];
    }
    h->loader_workers = loader_workers;
    h->kept = 0;
    read_children(h);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

int cp_threads_kept_walk(cp_threads *h, struct cp_threads_stats *out, int64_t *time_ns, int64_t *duration_ns) {
    pthread_mutex_lock(&h->mu);
    int rc = h->error ? h->error : h->kept;
    if (rc == 1) {
        *out = h->kept_stats;
        *time_ns = h->kept_time;
        *duration_ns = h->kept_duration;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int64_t cp_threads_last_walk_ns(cp_threads *h) {
    pthread_mutex_lock(&h->mu);
    int64_t t = h->last_walk_mono + h->offset_ns;
    pthread_mutex_unlock(&h->mu);
    return t;
}

int cp_threads_walks_pending(cp_threads *h) {
    pthread_mutex_lock(&h->mu);
    int n = h->nrows;
    pthread_mutex_unlock(&h->mu);
    return n;
}

int cp_threads_drain_walks(cp_threads *h, int max, int64_t *time_ns, int64_t *duration_ns, double *run_s,
                           double *wait_s, int32_t *intraop, int32_t *loader_workers) {
    pthread_mutex_lock(&h->mu);
    int n = h->nrows < max ? h->nrows : max;
    for (int i = 0; i < n; i++) {
        const struct walk_row *r = &h->rows[i];
        time_ns[i] = r->time_ns;
        duration_ns[i] = r->duration_ns;
        memcpy(run_s + (size_t)i * CP_ROLES, r->run_s, sizeof(r->run_s));
        memcpy(wait_s + (size_t)i * CP_ROLES, r->wait_s, sizeof(r->wait_s));
        intraop[i] = r->intraop;
        loader_workers[i] = r->loader_workers;
    }
    memmove(h->rows, h->rows + n, (size_t)(h->nrows - n) * sizeof(*h->rows));
    h->nrows -= n;
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* ---- the host collector's rows ------------------------------------------------------------ */

void cp_procstat_set_time_offset(cp_procstat *h, int64_t offset_ns) { h->time_offset_ns = offset_ns; }

void cp_procstat_set_spill(cp_procstat *h, cp_spill *sp) {
    pthread_mutex_lock(&h->mu);
    h->spill = sp;
    pthread_mutex_unlock(&h->mu);
}

void cp_threads_set_spill(cp_threads *h, cp_spill *sp) {
    pthread_mutex_lock(&h->mu);
    h->spill = sp;
    pthread_mutex_unlock(&h->mu);
}
void cp_procstat_set_system_period(cp_procstat *h, int64_t period_ns) {
    pthread_mutex_lock(&h->mu);
    h->system_period_ns = period_ns > 0 ? period_ns : 0;
    pthread_mutex_unlock(&h->mu);
}

int cp_procstat_root_gone(cp_procstat *h) {
    pthread_mutex_lock(&h->mu);
    int gone = h->root_gone;
    pthread_mutex_unlock(&h->mu);
    return gone;
}

int cp_procstat_pending(cp_procstat *h) {
    pthread_mutex_lock(&h->mu);
    int n = (int)h->nrows;
    pthread_mutex_unlock(&h->mu);
    return n;
}

static int add_row(cp_procstat *h, int64_t t, int64_t duration, int metric, double value) {
    if (h->nrows == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256;
        int64_t *tt = realloc(h->r_time, cap * sizeof(int64_t));
        if (tt) h->r_time = tt;
        int64_t *dd = realloc(h->r_duration, cap * sizeof(int64_t));
        if (dd) h->r_duration = dd;
        int32_t *mm = realloc(h->r_metric, cap * sizeof(int32_t));
        if (mm) h->r_metric = mm;
        double *vv = realloc(h->r_value, cap * sizeof(double));
        if (vv) h->r_value = vv;
        if (!tt || !dd || !mm || !vv) return -ENOMEM;
        h->cap = cap;
    }
    h->r_time[h->nrows] = t;
    h->r_duration[h->nrows] = duration;
    h->r_metric[h->nrows] = metric;
    h->r_value[h->nrows] = value;
    h->nrows++;
    return 0;
}

static double delta(double cur, double prev) { return cur > prev ? cur - prev : 0.0; }

static int record_locked(cp_procstat *h);

int cp_procstat_record(cp_procstat *h) {
    pthread_mutex_lock(&h->mu);
    int rc = record_locked(h);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int cp_procstat_tick(void *arg, int64_t now_ns) {
    (void)now_ns;
    cp_procstat *h = arg;
    pthread_mutex_lock(&h->mu);
    int rc = record_locked(h);
    if (rc < 0 && !h->tick_error) h->tick_error = rc;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int cp_procstat_tick_error(cp_procstat *h) {
    pthread_mutex_lock(&h->mu);
    int rc = h->tick_error;
    h->tick_error = 0;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int record_locked(cp_procstat *h) {
    struct cp_tree_stats tree;
    struct cp_system_stats sys;
    memset(&tree, 0, sizeof(tree));
    int rc = 0;
    int read_tree = h->root > 0 && !h->root_gone;
    /* due a twentieth early: a 1 s period on a 100 ms tick reads every 10th tick, not 11th */
    int64_t mono = monotonic_ns() + h->time_offset_ns;
    int read_sys = !h->have_prev ||
                   mono - h->prev_sys_ns >= h->system_period_ns - h->system_period_ns / 20;
    h->skip_status = !read_sys;            /* the context switches come with the system figures */
    rc = read_tree ? cp_procstat_tree(h, &tree) : 0;
    h->skip_status = 0;
    if (rc < 0) return rc;
    if (read_sys && (rc = cp_procstat_system(h, &sys)) < 0) return rc;
    int64_t now = monotonic_ns() + h->time_offset_ns;
    int64_t d = now - h->prev_ns, d_sys = now - h->prev_sys_ns;
    size_t before = h->nrows;
    if (read_tree && !tree.root_alive) {
        h->root_gone = 1;
        read_tree = 0;
    }
    if (h->have_prev) {
        if (read_tree) {
            const struct cp_tree_stats *p = &h->prev_tree;
            double deltas[][2] = {
                {CP_HOST_CPU_USER, delta(tree.user_s, p->user_s)},
                {CP_HOST_CPU_SYSTEM, delta(tree.system_s, p->system_s)},
                {CP_HOST_READ_BYTES, delta((double)tree.read_bytes, (double)p->read_bytes)},
                {CP_HOST_WRITE_BYTES, delta((double)tree.write_bytes, (double)p->write_bytes)},
                {CP_HOST_RUN_DELAY, delta(tree.run_delay_s, p->run_delay_s)},
            };
            for (size_t i = 0; i < sizeof(deltas) / sizeof(deltas[0]) && rc == 0; i++)
                rc = add_row(h, now, d, (int)deltas[i][0], deltas[i][1]);
            if (read_sys && rc == 0)       /* over the time since status was last read */
                rc = add_row(h, now, d_sys, CP_HOST_CTX_VOLUNTARY,
                             delta((double)tree.ctx_voluntary, (double)p->ctx_voluntary));
            if (read_sys && rc == 0)
                rc = add_row(h, now, d_sys, CP_HOST_CTX_INVOLUNTARY,
                             delta((double)tree.ctx_involuntary, (double)p->ctx_involuntary));
            if (rc == 0) rc = add_row(h, now, -1, CP_HOST_RSS, (double)tree.rss_bytes);
            if (rc == 0) rc = add_row(h, now, -1, CP_HOST_THREADS, (double)tree.threads);
            if (rc == 0) rc = add_row(h, now, -1, CP_HOST_PROCESSES, (double)tree.processes);
        }
    }
    if (h->have_prev && read_sys) {
        const struct cp_system_stats *p = &h->prev_sys;
        double total = sys.cpu_total_s - p->cpu_total_s;
        if (total > 0 && rc == 0) {
            double idle = sys.cpu_idle_s - p->cpu_idle_s, iowait = sys.cpu_iowait_s - p->cpu_iowait_s;
            double busy = total - idle - iowait;
            rc = add_row(h, now, d_sys, CP_HOST_SYS_CPU_UTIL, 100.0 * (busy > 0 ? busy : 0.0) / total);
            if (rc == 0) rc = add_row(h, now, d_sys, CP_HOST_SYS_CPU_IOWAIT, 100.0 * (iowait > 0 ? iowait : 0.0) / total);
        }
        if (rc == 0) rc = add_row(h, now, -1, CP_HOST_SYS_MEM_USED,
                                  (double)sys.mem_total_bytes - (double)sys.mem_available_bytes);
        if (rc == 0) rc = add_row(h, now, -1, CP_HOST_SYS_MEM_AVAILABLE, (double)sys.mem_available_bytes);
    }
    if (rc < 0) return rc;
    if (h->spill && h->nrows > before) {
        int32_t head[2] = {(int32_t)(h->nrows - before), 0};
        uint32_t n = (uint32_t)(h->nrows - before);
        const void *parts[5] = {head, h->r_time + before, h->r_duration + before, h->r_metric + before,
                                h->r_value + before};
        uint32_t lens[5] = {sizeof(head), n * 8, n * 8, n * 4, n * 8};
        cp_spill_add(h->spill, CP_SPILL_HOST, 5, parts, lens);
    }
    if (read_tree) {
        if (!read_sys) {                   /* not read this time: the last counts stay the baseline */
            tree.ctx_voluntary = h->prev_tree.ctx_voluntary;
            tree.ctx_involuntary = h->prev_tree.ctx_involuntary;
        }
        h->prev_tree = tree;
    }
    if (read_sys) {
        h->prev_sys = sys;
        h->prev_sys_ns = now;
    }
    h->prev_ns = now;
    h->have_prev = 1;
    return (int)(h->nrows - before);
}

int cp_procstat_drain(cp_procstat *h, int max, int64_t *time_ns, int64_t *duration_ns,
                      uint8_t *duration_valid, int32_t *metric, double *value) {
    pthread_mutex_lock(&h->mu);
    size_t n = h->nrows < (size_t)max ? h->nrows : (size_t)max;
    memset(duration_valid, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        time_ns[i] = h->r_time[i];
        metric[i] = h->r_metric[i];
        value[i] = h->r_value[i];
        if (h->r_duration[i] >= 0) {
            duration_ns[i] = h->r_duration[i];
            duration_valid[i / 8] |= (uint8_t)(1u << (i % 8));
        } else {
            duration_ns[i] = 0;
        }
    }
    size_t rest = h->nrows - n;
    memmove(h->r_time, h->r_time + n, rest * sizeof(int64_t));
    memmove(h->r_duration, h->r_duration + n, rest * sizeof(int64_t));
    memmove(h->r_metric, h->r_metric + n, rest * sizeof(int32_t));
    memmove(h->r_value, h->r_value + n, rest * sizeof(double));
    h->nrows = rest;
    pthread_mutex_unlock(&h->mu);
    return (int)n;
}
