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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        for (char *p = buf; *p;) {
            while (*p == ' ' || *p == '\n') p++;
            if (!*p) break;
            rc = push(stack, (int)strtol(p, &p, 10));
            if (rc) break;
        }
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

/* The root's files and the system files stay open between samples (pread from 0);
 * descendants come and go, so theirs are opened each time. */
struct cp_procstat {
    char proc[256];
    int root;
    int root_stat, root_io, root_status, root_sched;   /* -1 when not opened */
    int sys_stat, sys_meminfo;
    long tick, page;
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
    h->root_stat = h->root_io = h->root_status = h->root_sched = -1;
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
    }
    *err = 0;
    return h;
}

void cp_procstat_close(cp_procstat *h) {
    if (!h) return;
    int fds[] = {h->root_stat, h->root_io, h->root_status, h->root_sched, h->sys_stat, h->sys_meminfo};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0) close(fds[i]);
    free(h);
}

/* One walk of the tree. Each process's children are listed before its stat is read: a child
 * reaped before that read is in the parent's cutime, one reaped after it is read itself --
 * unless it is reaped between the two reads, in which case its stat is gone when its turn
 * comes: *vanished is set and the caller walks again. */
static int walk_tree(cp_procstat *h, struct cp_tree_stats *out, int *vanished) {
    memset(out, 0, sizeof(*out));
    *vanished = 0;
    char path[512], buf[4096];
    struct pid_stack stack = {0};
    int rc = push_children(h->proc, h->root, &stack);
    if (rc < 0 || pread_small(h->root_stat, buf, sizeof(buf)) <= 0 ||
        add_stat(buf, out, h->tick, h->page) != 1) {
        free(stack.v);
        memset(out, 0, sizeof(*out));
        return rc < 0 ? rc : 0;                     /* root exited: root_alive stays 0 */
    }
    out->root_alive = 1;
    if (h->root_io >= 0 && pread_small(h->root_io, buf, sizeof(buf)) > 0) add_io(buf, out);
    if (h->root_status >= 0 && pread_small(h->root_status, buf, sizeof(buf)) > 0) add_status(buf, out);
    if (h->root_sched >= 0 && pread_small(h->root_sched, buf, sizeof(buf)) > 0) add_schedstat(buf, out);
    while (rc == 0 && stack.n > 0) {
        int pid = stack.v[--stack.n];
        size_t mark = stack.n;
        rc = push_children(h->proc, pid, &stack);
        if (rc < 0) break;
        snprintf(path, sizeof(path), "%s/%d/stat", h->proc, pid);
        int counted = read_small(path, buf, sizeof(buf)) > 0 ? add_stat(buf, out, h->tick, h->page) : 0;
        if (!counted) {                             /* reaped since it was listed */
            *vanished = 1;
            stack.n = mark;                         /* its orphans are no longer ours */
            continue;
        }
        /* a zombie's I/O also moves to its parent when reaped (its ctx switches do not) */
        snprintf(path, sizeof(path), "%s/%d/io", h->proc, pid);
        if (read_small(path, buf, sizeof(buf)) > 0) add_io(buf, out);
        if (counted == 2) continue;
        snprintf(path, sizeof(path), "%s/%d/status", h->proc, pid);
        if (read_small(path, buf, sizeof(buf)) > 0) add_status(buf, out);
        snprintf(path, sizeof(path), "%s/%d/schedstat", h->proc, pid);
        if (read_small(path, buf, sizeof(buf)) > 0) add_schedstat(buf, out);
    }
    free(stack.v);
    return rc;
}

/* A process reaped mid-walk would be in neither its own stat nor its parent's cutime: the
 * total would dip and the next sample count it again. Such a walk is taken again (3 times
 * at most: a tree that reaps that fast keeps the last walk). */
static int cp_procstat_tree(cp_procstat *h, struct cp_tree_stats *out) {
    memset(out, 0, sizeof(*out));
    if (h->root <= 0 || h->root_stat < 0) return 0;
    for (int attempt = 0;; attempt++) {
        int vanished = 0;
        int rc = walk_tree(h, out, &vanished);
        if (rc < 0 || !vanished || attempt == 3) return rc;
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
