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

int cp_proc_tree_stats(const char *proc, int root, struct cp_tree_stats *out) {
    memset(out, 0, sizeof(*out));
    long tick = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    struct pid_stack stack = {0};
    int rc = push(&stack, root);
    char path[512], buf[4096];
    while (rc == 0 && stack.n > 0) {
        int pid = stack.v[--stack.n];
        snprintf(path, sizeof(path), "%s/%d/stat", proc, pid);
        if (read_small(path, buf, sizeof(buf)) <= 0) {
            if (pid == root) break;   /* root gone: root_alive stays 0 */
            continue;                 /* a child that exited meanwhile */
        }
        /* fields after the command's closing parenthesis, starting at field 3 (state) */
        char *p = strrchr(buf, ')');
        if (!p) continue;
        p += 2;
        unsigned long long f[22] = {0};   /* f[i] = field i+3 */
        int nf = 0;
        while (*p && nf < 22) {
            while (*p == ' ') p++;
            if (nf == 0) {                /* state is a letter */
                char state = *p;
                if (pid == root && (state == 'Z' || state == 'X')) break;
                f[nf++] = 0;
                while (*p && *p != ' ') p++;
                continue;
            }
            f[nf++] = strtoull(p, &p, 10);
        }
        if (nf < 22) continue;
        if (pid == root) out->root_alive = 1;
        /* utime 14, stime 15, cutime 16, cstime 17 (cutime: reaped children, whose time
         * left the live tree with them), num_threads 20, rss 24 (pages) */
        out->user_s += (double)(f[11] + f[13]) / (double)tick;
        out->system_s += (double)(f[12] + f[14]) / (double)tick;
        out->threads += (uint32_t)f[17];
        out->rss_bytes += f[21] * (uint64_t)page;
        out->processes++;

        snprintf(path, sizeof(path), "%s/%d/io", proc, pid);
        if (read_small(path, buf, sizeof(buf)) > 0) {
            uint64_t v;
            if (field_u64(buf, "read_bytes", &v)) out->read_bytes += v;
            if (field_u64(buf, "write_bytes", &v)) out->write_bytes += v;
        }
        snprintf(path, sizeof(path), "%s/%d/status", proc, pid);
        if (read_small(path, buf, sizeof(buf)) > 0) {
            uint64_t v;
            if (field_u64(buf, "voluntary_ctxt_switches", &v)) out->ctx_voluntary += v;
            if (field_u64(buf, "nonvoluntary_ctxt_switches", &v)) out->ctx_involuntary += v;
        }
        rc = push_children(proc, pid, &stack);
    }
    free(stack.v);
    return rc;
}

int cp_system_stats(const char *proc, struct cp_system_stats *out) {
    memset(out, 0, sizeof(*out));
    char path[512], buf[16384];
    snprintf(path, sizeof(path), "%s/stat", proc);
    int n = read_small(path, buf, sizeof(buf));
    if (n < 0) return n;
    /* cpu  user nice system idle iowait irq softirq steal guest guest_nice (USER_HZ);
     * guest time is already inside user, so it is not added again */
    unsigned long long v[8] = {0};
    if (strncmp(buf, "cpu ", 4) != 0) return -EINVAL;
    char *p = buf + 4;
    for (int i = 0; i < 8; i++) v[i] = strtoull(p, &p, 10);
    long tick = sysconf(_SC_CLK_TCK);
    uint64_t total = 0;
    for (int i = 0; i < 8; i++) total += v[i];
    out->cpu_total_s = (double)total / (double)tick;
    out->cpu_idle_s = (double)v[3] / (double)tick;
    out->cpu_iowait_s = (double)v[4] / (double)tick;

    snprintf(path, sizeof(path), "%s/meminfo", proc);
    n = read_small(path, buf, sizeof(buf));
    if (n < 0) return n;
    uint64_t kb;
    if (field_u64(buf, "MemTotal", &kb)) out->mem_total_bytes = kb * 1024;
    if (field_u64(buf, "MemAvailable", &kb)) out->mem_available_bytes = kb * 1024;
    return 0;
}
