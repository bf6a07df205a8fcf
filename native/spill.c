/* The spill: what the perf sampler's thread takes (counter ticks, host rows, thread walks, the
 * critical thread's readings), in a file of the run as it is taken, so the Python drain can wake
 * every few seconds and a killed profiler still loses nothing it had read (recovery turns the
 * file into rows: collectors/perf/spill.py).
 *
 * The files are mapped (MAP_SHARED): a record is a memcpy, no syscall (a write() per tick, with
 * its mtime update, cost ~20 us of a 100 ms tick here), and the page cache keeps it when the
 * process is killed. Their blocks are allocated before they are mapped (posix_fallocate): a page
 * of a full disk is never touched, so a full disk turns the spill off instead of raising SIGBUS.
 *
 * Two files take turns: the drain rotates before it takes the rings, so the file it leaves holds
 * only records it is about to take, and is emptied at the next rotation (by then those rows are
 * in the journal). A record's kind is stored last: one cut short by the kill reads as the end.
 *
 * File: "CPSPILL1", uint64 sequence, 16 bytes reserved; then records: uint32 kind, uint32 payload
 * bytes, payload; a kind of 0 ends them (the rest of the file is zeros).
 */
#define _GNU_SOURCE
#include "counterprof_native.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEAD 32
#define FIRST_SIZE (256 * 1024)

struct cp_spill {
    pthread_mutex_t mu;
    int fd[2];
    char *map[2];
    size_t size[2], used[2];
    int cur;
    uint64_t seq;
    int err;                   /* the first -errno; the spill is off from then on */
    uint64_t records, written;
};

/* fd's file at size bytes, its blocks allocated, mapped (old: its current mapping, or NULL). */
static int map_file(int fd, char **map, size_t old_size, size_t size) {
    if (ftruncate(fd, (off_t)size) < 0) return -errno;
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc != 0) return -rc;
    void *m = *map ? mremap(*map, old_size, size, MREMAP_MAYMOVE)
                   : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return -errno;
    *map = m;
    return 0;
}

static void start_file(cp_spill *sp, int i) {
    char *m = sp->map[i];
    if (sp->used[i] > HEAD) memset(m + HEAD, 0, sp->used[i] - HEAD);
    uint64_t seq = sp->seq++;
    memcpy(m, "CPSPILL1", 8);
    memcpy(m + 8, &seq, 8);
    sp->used[i] = HEAD;
}

cp_spill *cp_spill_new(int fd0, int fd1, int *err) {
    *err = 0;
    cp_spill *sp = calloc(1, sizeof(*sp));
    if (!sp) {
        *err = -ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&sp->mu, NULL);
    sp->fd[0] = fd0;
    sp->fd[1] = fd1;
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        rc = map_file(sp->fd[i], &sp->map[i], 0, FIRST_SIZE);
        if (rc == 0) sp->size[i] = FIRST_SIZE;
    }
    if (rc < 0) {
        *err = rc;
        cp_spill_free(sp);
        return NULL;
    }
    start_file(sp, 0);         /* file 1 stays zeros (no magic: not read) until its first turn */
    return sp;
}

int cp_spill_add(cp_spill *sp, uint32_t kind, int nparts, const void *const *parts, const uint32_t *lens) {
    if (!sp) return 0;
    uint32_t total = 0;
    for (int i = 0; i < nparts; i++) total += lens[i];
    pthread_mutex_lock(&sp->mu);
    int rc = sp->err, c = sp->cur;
    if (rc != 0) goto out;
    size_t need = sp->used[c] + 8 + total + 8;       /* and a zero kind after it */
    if (need > sp->size[c]) {
        size_t size = sp->size[c] * 2;
        while (size < need) size *= 2;
        rc = map_file(sp->fd[c], &sp->map[c], sp->size[c], size);
        if (rc < 0) {
            sp->err = rc;
            goto out;
        }
        sp->size[c] = size;
    }
    char *at = sp->map[c] + sp->used[c];
    size_t off = 8;
    for (int i = 0; i < nparts; i++) {
        memcpy(at + off, parts[i], lens[i]);
        off += lens[i];
    }
    memcpy(at + 4, &total, 4);
    __atomic_store_n((uint32_t *)(void *)at, kind, __ATOMIC_RELEASE);   /* last: the record is whole */
    sp->used[c] += 8 + total;
    sp->records++;
    sp->written += 8 + total;
out:
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

int cp_spill_rotate(cp_spill *sp) {
    pthread_mutex_lock(&sp->mu);
    int rc = sp->err;
    if (rc == 0) {
        sp->cur ^= 1;
        start_file(sp, sp->cur);
    }
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

void cp_spill_get_stats(cp_spill *sp, struct cp_spill_stats *out) {
    pthread_mutex_lock(&sp->mu);
    out->records = sp->records;
    out->bytes = sp->written;
    out->error = sp->err;
    pthread_mutex_unlock(&sp->mu);
}

void cp_spill_free(cp_spill *sp) {
    if (!sp) return;
    for (int i = 0; i < 2; i++)
        if (sp->map[i]) munmap(sp->map[i], sp->size[i]);
    pthread_mutex_destroy(&sp->mu);
    free(sp);
}
