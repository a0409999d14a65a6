/* The simulated engine's KV blocks in C: BlockPool (vLLM v1's block pool: reference counts,
 * chain hashes of full blocks, the LRU free queue) and KvTier (the host or disk tier behind it,
 * LRU by chain hash).
 *
 * Why C: a long simulation moves tens of millions of blocks through these structures, one at
 * a time, and in Python that was 80 % of the slowest runs (docs/benchmarks.md, "Where the time
 * goes": five passes at cheaper Python layouts all ended at the floor of a few dict operations
 * per block). Here a block costs a few array writes and one open-addressing probe.
 *
 * The Python classes in sim/kv_cache.py and sim/kv_tier.py (BlockPoolPy, KvTierPy) are the
 * specification: same methods, same results, same order of eviction, call by call
 * (tests/sim/test_sim_kv_native.py runs both on the same random calls and compares every
 * result and every state). The Python layout is lazy (runs of freed blocks with stale
 * entries); here the free queue is a log in a ring (see PoolObject), which is the order the
 * lazy runs stand for.
 *
 * Also the chain hashes the blocks are keyed by (chain_hashes, chain_cycle): Python's
 * hash((parent, tuple(block))) written out, for the engine's prompts held as int arrays.
 *
 * Blocks come and go as int32 arrays (array('i'), as the engine keeps a request's blocks):
 * read in place, handed back as new arrays; any other iterable of ints is read once. The
 * hashes as int64 arrays (a request's chain) or any sequence of ints.
 *
 * Optional: pyproject.toml's ext-modules build it where a compiler is; without it the Python
 * classes run (sim/native_blocks.py picks).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

/* BlockPoolPy.NEW_HASHES_KEPT: past this many new hashes, the free epoch moves on. */
#define NEW_HASHES_KEPT (1 << 16)

/* How far ahead a loop over hashes asks for the map's line (the memory misses of several
 * lookups then overlap instead of following one another). */
#define AHEAD 8
/* The free queue's first position (it grows both ways; see PoolObject). */
#define RING_BASE ((uint64_t)1 << 62)

/* An int as int64 (see get_i64): PyLong_AsLong where long is 64 bits. */
#if LONG_MAX == INT64_MAX
#define AS_I64(o) ((int64_t)PyLong_AsLong(o))
#else
#define AS_I64(o) ((int64_t)PyLong_AsLongLong(o))
#endif

/* Arrays of a few MB are read at random: on Linux, ask for huge pages (fewer TLB misses; a
 * whole run measured ~15 % faster with them). Freed with free(). */
#define HUGE_PAGE ((size_t)2 << 20)

static void *big_alloc(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= 2 * HUGE_PAGE) {
        void *p = NULL;
        size_t rounded = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        if (posix_memalign(&p, HUGE_PAGE, rounded) != 0)
            return NULL;
        madvise(p, rounded, MADV_HUGEPAGE);
        return p;
    }
#endif
    return malloc(bytes);
}

/* ---- int64 -> int32 map, open addressing, linear probing, backward-shift deletion ----
 * Key and value side by side: a probe is one cache line (the maps are far larger than the
 * caches, so a lookup costs what its memory misses cost). */

typedef struct {
    int64_t key;
    int32_t val; /* -1: empty */
    int32_t pad;
} HEntry;

typedef struct {
    HEntry *e;
    Py_ssize_t mask;
    Py_ssize_t used;
} HMap;

static inline Py_ssize_t hm_home(Py_ssize_t mask, int64_t k)
{
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (Py_ssize_t)(x & (uint64_t)mask);
}

/* A hint: the line a lookup of k will read first. */
static inline void hm_prefetch(const HMap *m, int64_t k)
{
    __builtin_prefetch(&m->e[hm_home(m->mask, k)]);
}

static int hm_alloc(HMap *m, Py_ssize_t cap)
{
    m->e = big_alloc(sizeof(HEntry) * (size_t)cap);
    if (!m->e) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++)
        m->e[i].val = -1;
    m->mask = cap - 1;
    m->used = 0;
    return 0;
}

static void hm_free(HMap *m)
{
    free(m->e);
    m->e = NULL;
    m->mask = 0;
    m->used = 0;
}

static void hm_clear(HMap *m)
{
    if (m->e)
        for (Py_ssize_t i = 0; i <= m->mask; i++)
            m->e[i].val = -1;
    m->used = 0;
}

/* The slot holding k, or -1. */
static inline Py_ssize_t hm_find(const HMap *m, int64_t k)
{
    Py_ssize_t i = hm_home(m->mask, k);
    for (;;) {
        const HEntry *x = &m->e[i];
        if (x->val < 0)
            return -1;
        if (x->key == k)
            return i;
        i = (i + 1) & m->mask;
    }
}

static inline int32_t hm_get(const HMap *m, int64_t k)
{
    Py_ssize_t i = hm_find(m, k);
    return i < 0 ? -1 : m->e[i].val;
}

static int hm_grow(HMap *m)
{
    HMap old = *m;
    if (hm_alloc(m, (old.mask + 1) * 2) < 0) {
        *m = old;
        return -1;
    }
    for (Py_ssize_t i = 0; i <= old.mask; i++) {
        if (old.e[i].val >= 0) {
            Py_ssize_t j = hm_home(m->mask, old.e[i].key);
            while (m->e[j].val >= 0)
                j = (j + 1) & m->mask;
            m->e[j] = old.e[i];
            m->used++;
        }
    }
    hm_free(&old);
    return 0;
}

/* Insert k (not present) -> v. */
static int hm_insert(HMap *m, int64_t k, int32_t v)
{
    if ((m->used + 1) * 2 > m->mask + 1 && hm_grow(m) < 0)
        return -1;
    Py_ssize_t i = hm_home(m->mask, k);
    while (m->e[i].val >= 0)
        i = (i + 1) & m->mask;
    m->e[i].key = k;
    m->e[i].val = v;
    m->used++;
    return 0;
}

static void hm_delete_slot(HMap *m, Py_ssize_t i)
{
    Py_ssize_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->e[j].val < 0)
            break;
        Py_ssize_t home = hm_home(m->mask, m->e[j].key);
        /* Entry j stays where it is iff its home lies cyclically in (i, j]. */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            m->e[i] = m->e[j];
            i = j;
        }
    }
    m->e[i].val = -1;
    m->used--;
}

/* An int as int64. PyLong_AsLong, not PyLong_AsLongLong: on CPython 3.11 the latter goes
 * through _PyLong_AsByteArray for every int past one digit (a chain hash is three), about
 * half of a lookup's time; the former folds the digits in a loop. Same errors (TypeError,
 * OverflowError past 64 bits); where long is 32 bits (Windows), PyLong_AsLongLong. */
static inline int get_i64(PyObject *o, int64_t *out)
{
    int64_t v = AS_I64(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* A sequence of hashes as a caller hands it: an int64 buffer (array('q'): the simulated
 * engine keeps each request's chain so, read here in place: a list's ints are objects
 * scattered over the heap, one memory miss each in a long context) or any sequence of ints. */
typedef struct {
    const int64_t *raw; /* the buffer's, or NULL */
    PyObject **items;   /* else the sequence's */
    Py_ssize_t n;
    Py_buffer view;
    int has_view;
    PyObject *fast;
} HashSrc;

/* o's buffer, held in `view`, where o is one piece of `itemsize`-byte items in format f1 or
 * f2 (1); else nothing held (0): bytes and the like, or a buffer not in one piece, are read
 * as a sequence of ints. */
static int view_of(PyObject *o, Py_buffer *view, Py_ssize_t itemsize, const char *f1,
                   const char *f2)
{
    if (!PyObject_CheckBuffer(o))
        return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format;
    if (view->itemsize == itemsize && f && (!strcmp(f, f1) || (f2 && !strcmp(f, f2))))
        return 1;
    PyBuffer_Release(view);
    return 0;
}

static int src_open(HashSrc *s, PyObject *o, const char *what)
{
    s->raw = NULL;
    s->items = NULL;
    s->has_view = 0;
    s->fast = NULL;
    if (view_of(o, &s->view, 8, "q", "l")) {
        s->has_view = 1;
        s->raw = (const int64_t *)s->view.buf;
        s->n = s->view.len / 8;
        return 0;
    }
    s->fast = PySequence_Fast(o, what);
    if (!s->fast)
        return -1;
    s->items = PySequence_Fast_ITEMS(s->fast);
    s->n = PySequence_Fast_GET_SIZE(s->fast);
    return 0;
}

static void src_close(HashSrc *s)
{
    if (s->has_view)
        PyBuffer_Release(&s->view);
    s->has_view = 0;
    Py_CLEAR(s->fast);
}

/* Hashes read AHEAD of their lookups, each converted once: the lookup of item i finds its
 * value here, and the map's line for item i + FEED_AHEAD was asked for when that one was
 * converted. An item that does not convert is raised when its turn comes (the items before
 * it are processed first, as in the Python classes). */
/* Further ahead than AHEAD: a loop over a chain does little but probe (a hash converted, a
 * line read), so 8 items ahead left it waiting on the map (two thirds of `longest_hit`'s time
 * on one load, with a fleet's 8 maps out of the cache); 64 ahead made `longest_hit` 7.0 ->
 * 4.5 % of an 8-engine run (perf samples; 32: 4.9 %). */
#define FEED_AHEAD 64
#define FEED_RING 128 /* a power of two above FEED_AHEAD */

typedef struct {
    const HashSrc *src;
    Py_ssize_t n;    /* items fed: src's first n */
    Py_ssize_t done; /* items converted: [0, done) */
    Py_ssize_t bad;  /* the first item that did not convert, or n */
    const HMap *map;
    int64_t val[FEED_RING];
} HashFeed;

static inline void feed_fill(HashFeed *f, Py_ssize_t upto)
{
    if (upto > f->bad)
        upto = f->bad;
    const int64_t *raw = f->src->raw;
    while (f->done < upto) {
        int64_t v;
        if (raw)
            v = raw[f->done];
        else {
            v = AS_I64(f->src->items[f->done]);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                f->bad = f->done;
                return;
            }
            f->val[f->done & (FEED_RING - 1)] = v;
        }
        hm_prefetch(f->map, v);
        f->done++;
    }
}

static inline void feed_init(HashFeed *f, const HashSrc *src, Py_ssize_t n, const HMap *map)
{
    f->src = src;
    f->n = n;
    f->done = 0;
    f->bad = n;
    f->map = map;
    feed_fill(f, n < FEED_AHEAD ? n : FEED_AHEAD);
}

/* Item i's hash (i < n, called in order), having asked for the lines AHEAD of it. */
static inline int feed_get(HashFeed *f, Py_ssize_t i, int64_t *out)
{
    feed_fill(f, i + 1 + FEED_AHEAD < f->n ? i + 1 + FEED_AHEAD : f->n);
    if (f->src->raw) {
        *out = f->src->raw[i];
        return 0;
    }
    if (i >= f->bad)
        return get_i64(f->src->items[i], out); /* raises its error */
    *out = f->val[i & (FEED_RING - 1)];
    return 0;
}

/* ================================ KvTier ================================ */

/* One stored block: its hash and its neighbours in the LRU, in one line. */
typedef struct KvTierObject {
    PyObject_HEAD
    PyObject *name;
    Py_ssize_t capacity_blocks;
    PyObject *load_tokens_per_s; /* as given (an int stays an int, as in KvTierPy) */
    PyObject *lower;             /* None or a KvTier */
    long long stored_blocks;
    long long evicted_blocks;
    long long loaded_blocks;
    /* The LRU as a log: every store and every move appends the hash at the tail (sequence
     * number `tail`); the entry it had before goes stale (live = 0). The live entries from
     * `head` to `tail`, in order, are the LRU order, next evicted first. Evicting reads the
     * log in order (memory read in sequence, unlike a linked list's), and the map's lines of
     * the hashes about to be evicted can be fetched ahead. The log is a ring; when it is
     * full it is rewritten with its live entries only (or grown, if they fill half). */
    HMap map; /* hash -> its live entry's index in the ring */
    int64_t *rkey;
    uint8_t *rlive;
    int64_t rmask; /* the ring's size - 1 */
    int64_t head;  /* sequence numbers: entries [head, tail) are in the ring */
    int64_t tail;
    Py_ssize_t len; /* live entries */
} KvTierObject;

static PyTypeObject KvTierType;

#define TIER_READY(t)                                                                   \
    do {                                                                                \
        if ((t)->rkey == NULL) {                                                        \
            PyErr_SetString(PyExc_RuntimeError, "KvTier.__init__ was not called");      \
            return NULL;                                                                \
        }                                                                               \
    } while (0)

static void tier_release(KvTierObject *t)
{
    hm_free(&t->map);
    free(t->rkey);
    free(t->rlive);
    t->rkey = NULL;
    t->rlive = NULL;
}

static int tier_reset_slots(KvTierObject *t)
{
    tier_release(t);
    Py_ssize_t size = 1024;
    t->rkey = big_alloc(sizeof(int64_t) * (size_t)size);
    t->rlive = big_alloc((size_t)size);
    if (!t->rkey || !t->rlive || hm_alloc(&t->map, 64) < 0) {
        tier_release(t);
        PyErr_NoMemory();
        return -1;
    }
    t->rmask = size - 1;
    t->head = 0;
    t->tail = 0;
    t->len = 0;
    return 0;
}

static int tier_init(KvTierObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "capacity_blocks", "load_tokens_per_s", "lower", NULL};
    PyObject *name, *speed_obj, *lower = Py_None;
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnO|O", kwlist, &name, &capacity, &speed_obj,
                                     &lower))
        return -1;
    double speed = PyFloat_AsDouble(speed_obj);
    if (speed == -1.0 && PyErr_Occurred())
        return -1;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "the %S KV tier needs at least one block", name);
        return -1;
    }
    if (!(speed > 0)) {
        PyErr_Format(PyExc_ValueError, "the %S KV tier needs a positive load speed (tokens/s)", name);
        return -1;
    }
    if (lower != Py_None && !PyObject_TypeCheck(lower, &KvTierType)) {
        PyErr_SetString(PyExc_TypeError, "lower must be a KvTier or None");
        return -1;
    }
    if (tier_reset_slots(self) < 0)
        return -1;
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_INCREF(speed_obj);
    Py_XSETREF(self->load_tokens_per_s, speed_obj);
    Py_INCREF(lower);
    Py_XSETREF(self->lower, lower);
    self->capacity_blocks = capacity;
    self->stored_blocks = 0;
    self->evicted_blocks = 0;
    self->loaded_blocks = 0;
    return 0;
}

static void tier_dealloc(KvTierObject *self)
{
    tier_release(self);
    Py_XDECREF(self->name);
    Py_XDECREF(self->load_tokens_per_s);
    Py_XDECREF(self->lower);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Rewrite the ring with its live entries only, in order, from index 0, in a ring of `size`;
 * each live hash's map entry is pointed at its new index. */
static int tier_rewrite(KvTierObject *t, int64_t size)
{
    int64_t *rkey = big_alloc(sizeof(int64_t) * (size_t)size);
    uint8_t *rlive = big_alloc((size_t)size);
    if (!rkey || !rlive) {
        free(rkey);
        free(rlive);
        PyErr_NoMemory();
        return -1;
    }
    memset(rlive, 0, (size_t)size);
    int64_t n = 0;
    for (int64_t q = t->head; q < t->tail; q++) {
        int64_t i = q & t->rmask;
        if (!t->rlive[i])
            continue;
        if (q + AHEAD < t->tail)
            hm_prefetch(&t->map, t->rkey[(q + AHEAD) & t->rmask]);
        rkey[n] = t->rkey[i];
        rlive[n] = 1;
        t->map.e[hm_find(&t->map, rkey[n])].val = (int32_t)n;
        n++;
    }
    free(t->rkey);
    free(t->rlive);
    t->rkey = rkey;
    t->rlive = rlive;
    t->rmask = size - 1;
    t->head = 0;
    t->tail = n;
    return 0;
}

/* Append h at the tail (live); its index in the ring, or -1 (memory error). The map's entries
 * keep their slots (a rewrite only changes their values). */
static int32_t tier_push(KvTierObject *t, int64_t h)
{
    if (t->tail - t->head > t->rmask) {
        while (t->head < t->tail && !t->rlive[t->head & t->rmask])
            t->head++;
        if (t->tail - t->head > t->rmask) {
            int64_t size = t->rmask + 1;
            /* Grown while the live entries fill half of it: a rewrite then frees at least
             * half, so rewrites cost at most one map probe per entry appended. */
            if (2 * (int64_t)t->len >= size) {
                if (size >= ((int64_t)1 << 30)) {
                    PyErr_SetString(PyExc_OverflowError, "KvTier: too many blocks");
                    return -1;
                }
                size *= 2;
            }
            if (tier_rewrite(t, size) < 0)
                return -1;
        }
    }
    int64_t i = t->tail & t->rmask;
    t->rkey[i] = h;
    t->rlive[i] = 1;
    t->tail++;
    return (int32_t)i;
}

/* The map slot `at` (its hash held here) becomes most recent. */
static inline int tier_move(KvTierObject *t, Py_ssize_t at)
{
    t->rlive[t->map.e[at].val] = 0;
    int32_t i = tier_push(t, t->map.e[at].key);
    if (i < 0) {
        t->rlive[t->map.e[at].val] = 1; /* the ring was not changed: as before */
        return -1;
    }
    t->map.e[at].val = i;
    return 0;
}

static int tier_store_c(KvTierObject *t, int64_t h);

/* KvTierPy.store: a copy already here becomes most recent; else the LRU head goes to the
 * tier below (if full) and h is kept at the tail. */
static int tier_store_c(KvTierObject *t, int64_t h)
{
    Py_ssize_t at = hm_find(&t->map, h);
    if (at >= 0)
        return tier_move(t, at);
    if (t->len >= t->capacity_blocks) {
        while (!t->rlive[t->head & t->rmask])
            t->head++;
        int64_t i = t->head & t->rmask;
        int64_t old = t->rkey[i];
        t->rlive[i] = 0;
        t->head++;
        if (t->head + AHEAD < t->tail)
            hm_prefetch(&t->map, t->rkey[(t->head + AHEAD) & t->rmask]);
        hm_delete_slot(&t->map, hm_find(&t->map, old));
        t->len--;
        t->evicted_blocks++;
        if (t->lower != Py_None && tier_store_c((KvTierObject *)t->lower, old) < 0)
            return -1;
    }
    int32_t i = tier_push(t, h);
    if (i < 0)
        return -1;
    if (hm_insert(&t->map, h, i) < 0) {
        t->rlive[i] = 0;
        return -1;
    }
    t->len++;
    t->stored_blocks++;
    return 0;
}

/* A load: most recently used where held. 1 if held, 0 if not, -1 on error. */
static inline int tier_touch_c(KvTierObject *t, int64_t h)
{
    Py_ssize_t at = hm_find(&t->map, h);
    if (at < 0)
        return 0;
    return tier_move(t, at) < 0 ? -1 : 1;
}

static PyObject *tier_store(KvTierObject *self, PyObject *arg)
{
    TIER_READY(self);
    int64_t h;
    if (get_i64(arg, &h) < 0 || tier_store_c(self, h) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* tier_store_c of each of hs[0:n], in order. */
static int tier_store_batch(KvTierObject *t, const int64_t *hs, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            hm_prefetch(&t->map, hs[i + AHEAD]);
        if (tier_store_c(t, hs[i]) < 0)
            return -1;
    }
    return 0;
}

/* The hashes of a sequence of ints, as int64 (PyMem_Free it); NULL on error. */
static int64_t *hashes_of(PyObject **items, Py_ssize_t n)
{
    int64_t *hs = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!hs) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_i64(items[i], &hs[i]) < 0) {
            PyMem_Free(hs);
            return NULL;
        }
    }
    return hs;
}

static PyObject *tier_store_many(KvTierObject *self, PyObject *arg)
{
    TIER_READY(self);
    HashSrc src;
    if (src_open(&src, arg, "store_many takes an iterable of hashes") < 0)
        return NULL;
    /* Every one converted before any is stored (an error stores none). */
    int64_t *hs = src.raw ? NULL : hashes_of(src.items, src.n);
    int rc = -1;
    if (src.raw || hs)
        rc = tier_store_batch(self, src.raw ? src.raw : hs, src.n);
    PyMem_Free(hs);
    src_close(&src);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Move the held ones of items[0:n] to the tail, in order; with `stop`, only up to the first
 * not held. How many were held (with `stop`: the run's length); -1 on error. Lookups run
 * AHEAD of the moves (a move changes no map slot, only its value): the misses
 * of later hashes overlap the work on this one. */
static Py_ssize_t tier_touch_run(KvTierObject *t, const HashSrc *src, int stop)
{
    Py_ssize_t n = src->n;
    Py_ssize_t ring[AHEAD];
    Py_ssize_t held = 0;
    Py_ssize_t looked = 0; /* items looked up so far, the last AHEAD in ring[j % AHEAD] */
    HashFeed feed; /* its lines asked for AHEAD of the lookups, which run AHEAD of the moves */
    feed_init(&feed, src, n, &t->map);
    for (Py_ssize_t i = 0; i < n; i++) {
        while (looked < n && looked < i + AHEAD) {
            int64_t h;
            if (feed_get(&feed, looked, &h) < 0)
                return -1;
            Py_ssize_t at = hm_find(&t->map, h);
            if (at >= 0)
                __builtin_prefetch(&t->rlive[t->map.e[at].val]);
            ring[looked % AHEAD] = at;
            looked++;
        }
        Py_ssize_t at = ring[i % AHEAD];
        if (at < 0) {
            if (stop)
                break;
            continue;
        }
        if (tier_move(t, at) < 0)
            return -1;
        held++;
    }
    return held;
}

static PyObject *tier_load(KvTierObject *self, PyObject *arg)
{
    TIER_READY(self);
    int64_t h;
    if (get_i64(arg, &h) < 0)
        return NULL;
    if (tier_touch_c(self, h) < 0)
        return NULL;
    self->loaded_blocks++;
    Py_RETURN_NONE;
}

/* load_many (every one, all counted as loaded) or, with `stop`, load_prefix (up to the first
 * not held; the run's length, counted and returned). */
static PyObject *tier_load_seq(KvTierObject *self, PyObject *arg, int stop)
{
    TIER_READY(self);
    HashSrc src;
    if (src_open(&src, arg, "a KvTier load takes a sequence of hashes") < 0)
        return NULL;
    Py_ssize_t n = src.n;
    Py_ssize_t held = tier_touch_run(self, &src, stop);
    src_close(&src);
    if (held < 0)
        return NULL;
    if (!stop) {
        self->loaded_blocks += n;
        Py_RETURN_NONE;
    }
    self->loaded_blocks += held;
    return PyLong_FromSsize_t(held);
}

static PyObject *tier_load_many(KvTierObject *self, PyObject *arg)
{
    return tier_load_seq(self, arg, 0);
}

static PyObject *tier_load_prefix(KvTierObject *self, PyObject *arg)
{
    return tier_load_seq(self, arg, 1);
}

static PyObject *tier_lru_order(KvTierObject *self, PyObject *Py_UNUSED(ignored))
{
    TIER_READY(self);
    PyObject *out = PyList_New(self->len);
    if (!out)
        return NULL;
    Py_ssize_t n = 0;
    for (int64_t q = self->head; q < self->tail; q++) {
        int64_t i = q & self->rmask;
        if (!self->rlive[i])
            continue;
        PyObject *v = PyLong_FromLongLong(self->rkey[i]);
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, n++, v);
    }
    return out;
}

static PyObject *tier_clear(KvTierObject *self, PyObject *Py_UNUSED(ignored))
{
    TIER_READY(self);
    if (tier_reset_slots(self) < 0)
        return NULL;
    if (self->lower != Py_None) {
        PyObject *r = tier_clear((KvTierObject *)self->lower, NULL);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static PyObject *tier_usage(KvTierObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyFloat_FromDouble((double)self->len / (double)self->capacity_blocks);
}

static Py_ssize_t tier_len(KvTierObject *self) { return self->len; }

static int tier_contains(KvTierObject *self, PyObject *arg)
{
    if (self->rkey == NULL)
        return 0;
    int64_t h;
    if (!PyLong_Check(arg))
        return 0;
    h = AS_I64(arg);
    if (h == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0; /* no hash this large is stored */
    }
    return hm_get(&self->map, h) >= 0;
}

static PyMethodDef tier_methods[] = {
    {"store", (PyCFunction)tier_store, METH_O, "Keep a block the tier above evicted."},
    {"store_many", (PyCFunction)tier_store_many, METH_O, "store each, in order."},
    {"load", (PyCFunction)tier_load, METH_O, "A block read back: most recently used."},
    {"load_many", (PyCFunction)tier_load_many, METH_O, "load each, in order."},
    {"load_prefix", (PyCFunction)tier_load_prefix, METH_O,
     "load the longest run held, from the first; its length."},
    {"lru_order", (PyCFunction)tier_lru_order, METH_NOARGS, "Stored hashes, next evicted first."},
    {"clear", (PyCFunction)tier_clear, METH_NOARGS, "Forget every block, the tier below's too."},
    {"usage", (PyCFunction)tier_usage, METH_NOARGS, "Fraction of the capacity held."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef tier_members[] = {
    {"name", T_OBJECT, offsetof(KvTierObject, name), READONLY, NULL},
    {"capacity_blocks", T_PYSSIZET, offsetof(KvTierObject, capacity_blocks), READONLY, NULL},
    {"load_tokens_per_s", T_OBJECT, offsetof(KvTierObject, load_tokens_per_s), READONLY, NULL},
    {"lower", T_OBJECT, offsetof(KvTierObject, lower), READONLY, NULL},
    {"stored_blocks", T_LONGLONG, offsetof(KvTierObject, stored_blocks), 0, NULL},
    {"evicted_blocks", T_LONGLONG, offsetof(KvTierObject, evicted_blocks), 0, NULL},
    {"loaded_blocks", T_LONGLONG, offsetof(KvTierObject, loaded_blocks), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods tier_as_sequence = {
    .sq_length = (lenfunc)tier_len,
    .sq_contains = (objobjproc)tier_contains,
};

static PyTypeObject KvTierType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "thunder_mw.sim._kvblocks.KvTier",
    .tp_basicsize = sizeof(KvTierObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A host-memory or disk KV store of full blocks, by chain hash, evicting LRU.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)tier_init,
    .tp_dealloc = (destructor)tier_dealloc,
    .tp_methods = tier_methods,
    .tp_members = tier_members,
    .tp_as_sequence = &tier_as_sequence,
};

/* =============================== BlockPool =============================== */

typedef struct {
    PyObject_HEAD
    int num_blocks;
    int block_size;
    int32_t *ref;     /* references held; 0: in the free queue */
    int64_t *hash;    /* valid where has_hash */
    uint8_t *has_hash;
    /* The free queue, as a log: ring[(head..tail) & ring_mask] lists blocks in queue order
     * (head: the next reused), and entry p is live while its block is free and was put there
     * last (ref[b] == 0 and at[b] == p). Taking a block off the middle (a hit on a free
     * block) leaves a stale entry rather than relinking its neighbours; the head skips
     * those, and a full ring is compacted in place. So allocating reads the queue in
     * sequence and can fetch the blocks it is about to take ahead, where a linked list made
     * each step wait for the last (one memory miss a block once a fleet's pools outgrow
     * the cache). Positions only grow (prepending lowers head): uint64 from RING_BASE. */
    int32_t *ring;
    uint64_t ring_mask;
    uint64_t head, tail;
    uint64_t *at;
    /* Blocks with the same hash (two requests filled identical blocks at once, as vLLM
     * allows): the map names the first, dup[] chains the others in the order cached. */
    int32_t *dup;
    HMap by_hash;
    Py_ssize_t num_free;
    Py_ssize_t num_hashed; /* blocks carrying a hash */
    PyObject *tier;        /* None or a KvTier */
    long long free_epoch;
    /* BlockPoolPy.new_hashes: hashes made findable since the free epoch moved on, in
     * order, as int64s (a list's ints were an allocation and a free per cached block). */
    int64_t *fresh;
    Py_ssize_t nfresh, cfresh;
} PoolObject;

#define POOL_READY(p)                                                                   \
    do {                                                                                \
        if ((p)->ref == NULL) {                                                         \
            PyErr_SetString(PyExc_RuntimeError, "BlockPool.__init__ was not called");   \
            return NULL;                                                                \
        }                                                                               \
    } while (0)

/* The ints 0..n-1, made once for every pool (results list blocks by the thousand; one table
 * for all pools, so a fleet of engines reads one set of these objects, not one per engine).
 * It only grows; its ints live as long as the module. */
static PyObject **shared_ints;
static Py_ssize_t shared_ints_n;
#define INT_OF(b) (shared_ints[(b)])

static int ints_upto(Py_ssize_t n)
{
    if (n <= shared_ints_n)
        return 0;
    PyObject **grown = PyMem_Realloc(shared_ints, sizeof(PyObject *) * (size_t)n);
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    shared_ints = grown;
    for (Py_ssize_t b = shared_ints_n; b < n; b++) {
        PyObject *v = PyLong_FromSsize_t(b);
        if (!v)
            return -1;
        shared_ints[b] = v;
        shared_ints_n = b + 1;
    }
    return 0;
}

static void pool_release(PoolObject *p)
{
    free(p->ref);
    free(p->hash);
    free(p->has_hash);
    free(p->ring);
    free(p->at);
    free(p->dup);
    hm_free(&p->by_hash);
    p->ref = NULL;
    p->hash = NULL;
    p->has_hash = NULL;
    p->ring = NULL;
    p->at = NULL;
    p->dup = NULL;
}

static int pool_init(PoolObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"num_blocks", "block_size", "tier", NULL};
    int num_blocks, block_size;
    PyObject *tier = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ii|O", kwlist, &num_blocks, &block_size, &tier))
        return -1;
    if (num_blocks < 2) {
        PyErr_SetString(PyExc_ValueError, "num_blocks must be at least 2 (block 0 is the null block)");
        return -1;
    }
    if (num_blocks > INT32_MAX - 2) {
        PyErr_SetString(PyExc_OverflowError, "num_blocks is too large");
        return -1;
    }
    if (tier != Py_None && !PyObject_TypeCheck(tier, &KvTierType)) {
        PyErr_SetString(PyExc_TypeError, "tier must be a KvTier or None");
        return -1;
    }
    pool_release(self);
    size_t n = (size_t)num_blocks;
    self->ref = big_alloc(n * sizeof(int32_t));
    self->hash = big_alloc(n * sizeof(int64_t));
    self->has_hash = big_alloc(n);
    /* At least twice the blocks: a full ring is then at least half stale entries, so
     * compacting it costs O(1) a block put in since the last time. */
    size_t ring_size = 64;
    while (ring_size < 2 * n)
        ring_size *= 2;
    self->ring = big_alloc(ring_size * sizeof(int32_t));
    self->at = big_alloc(n * sizeof(uint64_t));
    self->dup = big_alloc(n * sizeof(int32_t));
    Py_ssize_t cap = 64;
    while (cap < 2 * (Py_ssize_t)n)
        cap *= 2;
    if (!self->ref || !self->hash || !self->has_hash || !self->ring || !self->at || !self->dup ||
        hm_alloc(&self->by_hash, cap) < 0) {
        pool_release(self);
        PyErr_NoMemory();
        return -1;
    }
    memset(self->ref, 0, n * sizeof(int32_t));
    memset(self->hash, 0, n * sizeof(int64_t));
    memset(self->has_hash, 0, n);
    memset(self->dup, 0xff, n * sizeof(int32_t));
    /* Entries past the tail are read (to fetch ahead), never used: keep them block ids. */
    memset(self->ring, 0, ring_size * sizeof(int32_t));
    memset(self->at, 0, n * sizeof(uint64_t));
    self->ring_mask = (uint64_t)ring_size - 1;
    self->num_blocks = num_blocks;
    if (ints_upto(num_blocks) < 0) {
        pool_release(self);
        return -1;
    }
    self->block_size = block_size;
    /* Block 0 is the null block, never free: it holds a reference nobody drops. */
    self->ref[0] = 1;
    self->head = self->tail = RING_BASE;
    for (int32_t b = 1; b < num_blocks; b++) {
        self->ring[self->tail & self->ring_mask] = b;
        self->at[b] = self->tail++;
    }
    self->num_free = num_blocks - 1;
    self->num_hashed = 0;
    Py_INCREF(tier);
    Py_XSETREF(self->tier, tier);
    self->free_epoch = 0;
    self->nfresh = 0;
    return 0;
}

static void pool_dealloc(PoolObject *self)
{
    pool_release(self);
    PyMem_Free(self->fresh);
    self->fresh = NULL;
    Py_XDECREF(self->tier);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline int pool_block(PoolObject *p, PyObject *o, int32_t *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= p->num_blocks) {
        PyErr_Format(PyExc_IndexError, "block %ld is not in this pool (0..%d)", v, p->num_blocks - 1);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* A sequence of blocks as a caller hands it: an int32 buffer (array('i'): the simulated
 * engine keeps each request's blocks so, read here in place: a list's ints are objects, one
 * to convert, and one memory miss, apiece in a long context) or any iterable of ints, read
 * once into `owned`. `blk_check` checks a range of ids against the pool (the iterable's are
 * checked as they are read). */
typedef struct {
    const int32_t *ids;
    Py_ssize_t n;
    Py_buffer view;
    int has_view;
    int32_t *owned;
} BlockSrc;

static int blk_open(PoolObject *p, BlockSrc *s, PyObject *o, const char *what)
{
    s->ids = NULL;
    s->n = 0;
    s->has_view = 0;
    s->owned = NULL;
    if (view_of(o, &s->view, 4, "i", NULL)) {
        s->has_view = 1;
        s->ids = (const int32_t *)s->view.buf;
        s->n = s->view.len / 4;
        return 0;
    }
    PyObject *fast = PySequence_Fast(o, what);
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    s->owned = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!s->owned) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pool_block(p, items[i], &s->owned[i]) < 0) {
            Py_DECREF(fast);
            PyMem_Free(s->owned);
            s->owned = NULL;
            return -1;
        }
    }
    Py_DECREF(fast);
    s->ids = s->owned;
    s->n = n;
    return 0;
}

static void blk_close(BlockSrc *s)
{
    if (s->has_view)
        PyBuffer_Release(&s->view);
    s->has_view = 0;
    PyMem_Free(s->owned);
    s->owned = NULL;
}

/* Every id of ids[0:n] a block of this pool (an array's are not checked as they are read). */
static int blk_check(const PoolObject *p, const int32_t *ids, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= p->num_blocks) {
            PyErr_Format(PyExc_IndexError, "block %ld is not in this pool (0..%d)", (long)ids[i],
                         p->num_blocks - 1);
            return -1;
        }
    }
    return 0;
}

/* Blocks handed back: an array('i') of ids (made from their bytes, in one copy). */
static PyObject *array_type;   /* array.array */
static PyObject *typecode_int;  /* "i" */
static PyObject *typecode_hash; /* "q" */

static PyObject *blocks_array(const int32_t *ids, Py_ssize_t n)
{
    PyObject *raw = PyBytes_FromStringAndSize((const char *)ids, (Py_ssize_t)sizeof(int32_t) * n);
    if (!raw)
        return NULL;
    PyObject *out = PyObject_CallFunctionObjArgs(array_type, typecode_int, raw, NULL);
    Py_DECREF(raw);
    return out;
}

/* The int64s as a new array('q'), taking `raw` (a bytes object of them) over. */
static PyObject *hashes_array(PyObject *raw)
{
    PyObject *out = PyObject_CallFunctionObjArgs(array_type, typecode_hash, raw, NULL);
    Py_DECREF(raw);
    return out;
}

/* Is the entry at position q live (its block free, and put there last)? */
static inline int q_live(const PoolObject *p, uint64_t q)
{
    int32_t b = p->ring[q & p->ring_mask];
    return p->ref[b] == 0 && p->at[b] == q;
}

/* Fetch what `q_live` reads of the entry `AHEAD` places on (a block id: see pool_init). */
static inline void q_prefetch(const PoolObject *p, uint64_t q)
{
    int32_t b = p->ring[(q + AHEAD) & p->ring_mask];
    __builtin_prefetch(&p->ref[b]);
    __builtin_prefetch(&p->at[b]);
}

/* Keep the live entries, in order, from head on (each moves toward the head, onto an entry
 * already read). */
static void q_compact(PoolObject *p)
{
    uint64_t to = p->head;
    for (uint64_t q = p->head; q != p->tail; q++) {
        q_prefetch(p, q);
        if (q_live(p, q)) {
            int32_t b = p->ring[q & p->ring_mask];
            p->ring[to & p->ring_mask] = b;
            p->at[b] = to++;
        }
    }
    p->tail = to;
}

static inline void q_room(PoolObject *p)
{
    if (p->tail - p->head > p->ring_mask)
        q_compact(p);
}

static inline void q_append(PoolObject *p, int32_t b)
{
    q_room(p);
    p->ring[p->tail & p->ring_mask] = b;
    p->at[b] = p->tail++;
}

static inline void q_prepend(PoolObject *p, int32_t b)
{
    q_room(p);
    p->ring[--p->head & p->ring_mask] = b;
    p->at[b] = p->head;
}

/* The head's block, taken off the queue (its reference count is the caller's to set). */
static inline int32_t q_pop(PoolObject *p)
{
    while (!q_live(p, p->head))
        p->head++;
    return p->ring[p->head++ & p->ring_mask];
}

/* Forget block b's hash (b is being reused): the map's entry moves to the next block with
 * the same hash, if any (BlockPoolPy._uncache_dup). */
static void pool_uncache(PoolObject *p, int32_t b)
{
    int64_t h = p->hash[b];
    Py_ssize_t i = hm_find(&p->by_hash, h);
    if (i >= 0) {
        int32_t first = p->by_hash.e[i].val;
        if (first == b) {
            if (p->dup[b] >= 0)
                p->by_hash.e[i].val = p->dup[b];
            else
                hm_delete_slot(&p->by_hash, i);
        }
        else {
            for (int32_t x = first; p->dup[x] >= 0; x = p->dup[x]) {
                if (p->dup[x] == b) {
                    p->dup[x] = p->dup[b];
                    break;
                }
            }
        }
    }
    p->dup[b] = -1;
    p->has_hash[b] = 0;
    p->num_hashed--;
}

/* Take the head of the free queue with one reference, its hash evicted (to the tier). */
static int pool_pop(PoolObject *p, int32_t *out)
{
    int32_t b = q_pop(p);
    p->ref[b] = 1;
    p->num_free--;
    *out = b;
    if (p->has_hash[b]) {
        int64_t h = p->hash[b];
        pool_uncache(p, b);
        if (p->tier != Py_None)
            return tier_store_c((KvTierObject *)p->tier, h);
    }
    return 0;
}

static PyObject *pool_allocate(PoolObject *self, PyObject *arg)
{
    POOL_READY(self);
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > self->num_free) {
        PyErr_Format(PyExc_ValueError, "cannot allocate %zd blocks, %zd free", n, self->num_free);
        return NULL;
    }
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "cannot allocate %zd blocks", n);
        return NULL;
    }
    int32_t *taken = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *evicted = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int64_t *gone = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    PyObject *out = NULL;
    if (!taken || !evicted || !gone) {
        PyErr_NoMemory();
        goto done;
    }
    /* Take them off the head; then forget their hashes, in the same order; then store those
     * in the tier, in that order (BlockPoolPy.allocate: the tier sees only the order). */
    Py_ssize_t ne = 0;
    uint64_t q = self->head;
    for (Py_ssize_t i = 0; i < n; q++) {
        q_prefetch(self, q);
        if (!q_live(self, q))
            continue; /* a stale entry (n <= num_free: the live ones come before the tail) */
        int32_t b = self->ring[q & self->ring_mask];
        self->ref[b] = 1;
        __builtin_prefetch(&self->has_hash[b]); /* read below */
        __builtin_prefetch(&self->hash[b]);     /* and these, where it has one */
        __builtin_prefetch(&self->dup[b]);
        taken[i++] = b;
    }
    self->head = q;
    self->num_free -= n;
    for (Py_ssize_t i = 0; i < n; i++)
        if (self->has_hash[taken[i]])
            evicted[ne++] = taken[i];
    for (Py_ssize_t i = 0; i < ne; i++) {
        if (i + AHEAD < ne)
            hm_prefetch(&self->by_hash, self->hash[evicted[i + AHEAD]]);
        gone[i] = self->hash[evicted[i]];
        pool_uncache(self, evicted[i]);
    }
    if (ne && self->tier != Py_None && tier_store_batch((KvTierObject *)self->tier, gone, ne) < 0)
        goto done;
    out = blocks_array(taken, n);
done:
    PyMem_Free(taken);
    PyMem_Free(evicted);
    PyMem_Free(gone);
    return out;
}

static PyObject *pool_allocate_one(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    POOL_READY(self);
    if (!self->num_free) {
        PyErr_SetString(PyExc_ValueError, "cannot allocate 1 block, 0 free");
        return NULL;
    }
    int32_t b;
    if (pool_pop(self, &b) < 0)
        return NULL;
    return Py_NewRef(INT_OF(b));
}

/* The blocks of an argument, every one checked against the pool. */
static int blk_open_checked(PoolObject *p, BlockSrc *s, PyObject *o, const char *what)
{
    if (blk_open(p, s, o, what) < 0)
        return -1;
    if (s->has_view && blk_check(p, s->ids, s->n) < 0) {
        blk_close(s);
        return -1;
    }
    return 0;
}

static PyObject *pool_touch(PoolObject *self, PyObject *arg)
{
    POOL_READY(self);
    BlockSrc src;
    if (blk_open_checked(self, &src, arg, "touch takes an iterable of blocks") < 0)
        return NULL;
    const int32_t *ids = src.ids;
    for (Py_ssize_t i = 0; i < src.n; i++) {
        int32_t b = ids[i];
        if (self->ref[b] > 0) {
            self->ref[b]++;
            continue;
        }
        self->ref[b] = 1; /* its entry in the queue is stale from now */
        self->num_free--;
    }
    blk_close(&src);
    Py_RETURN_NONE;
}

static void pool_new_epoch_list(PoolObject *self)
{
    self->nfresh = 0;
}

static int pool_add_fresh(PoolObject *self, int64_t h)
{
    if (self->nfresh == self->cfresh) {
        Py_ssize_t cap = self->cfresh ? 2 * self->cfresh : 1024;
        int64_t *grown = PyMem_Realloc(self->fresh, sizeof(int64_t) * (size_t)cap);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        self->fresh = grown;
        self->cfresh = cap;
    }
    self->fresh[self->nfresh++] = h;
    return 0;
}

/* BlockPoolPy._release: drop a reference on each block; those freed of `cached` join the
 * tail in that order, those freed of `uncached` the head, uncached[0] first.
 * `rev_*`: walk the ids from their end (free_request's reversal, without a copy). The ids
 * are blocks of this pool (checked by the caller). */
static int pool_release_ids(PoolObject *self, const int32_t *cached, Py_ssize_t nc, int rev_c,
                            const int32_t *uncached, Py_ssize_t nu, int rev_u)
{
    self->free_epoch++;
    pool_new_epoch_list(self);
    /* Check every block first: nothing changes on a bad one. */
    Py_ssize_t n = nc + nu;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n) {
            int32_t a = i + AHEAD < nc ? cached[i + AHEAD] : uncached[i + AHEAD - nc];
            __builtin_prefetch(&self->ref[a]);
            __builtin_prefetch(&self->at[a]);
        }
        int32_t b = i < nc ? cached[i] : uncached[i - nc];
        if (self->ref[b] <= 0) {
            PyErr_Format(PyExc_ValueError, "block %d is freed but no request holds it", (int)b);
            return -1;
        }
    }
    for (Py_ssize_t k = 0; k < nc; k++) {
        int32_t b = cached[rev_c ? nc - 1 - k : k];
        if (self->ref[b] == 1) {
            self->ref[b] = 0;
            q_append(self, b);
            self->num_free++;
        }
        else
            self->ref[b]--;
    }
    /* Prepending from the last to the first leaves the first at the head. */
    for (Py_ssize_t k = nu - 1; k >= 0; k--) {
        int32_t b = uncached[rev_u ? nu - 1 - k : k];
        if (self->ref[b] == 1) {
            self->ref[b] = 0;
            q_prepend(self, b);
            self->num_free++;
        }
        else
            self->ref[b]--;
    }
    return 0;
}

static PyObject *pool_free(PoolObject *self, PyObject *arg)
{
    POOL_READY(self);
    BlockSrc src;
    if (blk_open_checked(self, &src, arg, "free takes an iterable of blocks") < 0)
        return NULL;
    Py_ssize_t n = src.n;
    int32_t *cached = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *uncached = PyMem_Malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    PyObject *res = NULL;
    if (!cached || !uncached) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t nc = 0, nu = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = src.ids[i];
        if (self->has_hash[b])
            cached[nc++] = b;
        else
            uncached[nu++] = b;
    }
    if (pool_release_ids(self, cached, nc, 0, uncached, nu, 0) < 0)
        goto done;
    res = Py_None;
    Py_INCREF(res);
done:
    PyMem_Free(cached);
    PyMem_Free(uncached);
    blk_close(&src);
    return res;
}

static PyObject *pool_free_cached(PoolObject *self, PyObject *arg)
{
    POOL_READY(self);
    BlockSrc src;
    if (blk_open_checked(self, &src, arg, "free_cached takes a sequence of blocks") < 0)
        return NULL;
    int rc = pool_release_ids(self, src.ids, src.n, 0, NULL, 0, 0);
    blk_close(&src);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *pool_free_request(PoolObject *self, PyObject *args)
{
    POOL_READY(self);
    PyObject *blocks;
    Py_ssize_t num_cached;
    if (!PyArg_ParseTuple(args, "On:free_request", &blocks, &num_cached))
        return NULL;
    BlockSrc src;
    if (blk_open_checked(self, &src, blocks, "free_request takes a list of blocks") < 0)
        return NULL;
    Py_ssize_t n = src.n;
    /* Python's slice bounds: blocks[:num_cached] and blocks[num_cached:]. */
    Py_ssize_t k = num_cached;
    if (k < 0)
        k = k + n < 0 ? 0 : k + n;
    if (k > n)
        k = n;
    int rc = pool_release_ids(self, src.ids, k, 1, src.ids + k, n - k, 1);
    blk_close(&src);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int pool_cache_pairs(PoolObject *self, const int32_t *blocks, const HashSrc *hashes,
                            Py_ssize_t n)
{
    HashFeed feed;
    feed_init(&feed, hashes, n, &self->by_hash);
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t b = blocks[i];
        int64_t h;
        if (feed_get(&feed, i, &h) < 0)
            return -1;
        if (self->has_hash[b])
            continue; /* it keeps its hash */
        Py_ssize_t at = hm_find(&self->by_hash, h);
        if (at < 0) {
            if (hm_insert(&self->by_hash, h, b) < 0 || pool_add_fresh(self, h) < 0)
                return -1;
        }
        else {
            int32_t x = self->by_hash.e[at].val;
            while (self->dup[x] >= 0)
                x = self->dup[x];
            self->dup[x] = b;
            self->dup[b] = -1;
        }
        self->hash[b] = h;
        self->has_hash[b] = 1;
        self->num_hashed++;
    }
    return 0;
}

static PyObject *pool_cache_range(PoolObject *self, PyObject *args)
{
    POOL_READY(self);
    PyObject *blocks, *hashes;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "OOnn:cache_range", &blocks, &hashes, &start, &end))
        return NULL;
    /* blocks[start:end] and hashes[start:end], read in place (Python's slice bounds). */
    BlockSrc bs;
    if (blk_open(self, &bs, blocks, "cache_range takes a sequence of blocks") < 0)
        return NULL;
    HashSrc hs;
    if (src_open(&hs, hashes, "cache_range takes a sequence of hashes") < 0) {
        blk_close(&bs);
        return NULL;
    }
    Py_ssize_t b0 = start, b1 = end, h0 = start, h1 = end;
    Py_ssize_t nb = PySlice_AdjustIndices(bs.n, &b0, &b1, 1);
    Py_ssize_t nh = PySlice_AdjustIndices(hs.n, &h0, &h1, 1);
    HashSrc part = hs; /* the same storage from h0 on */
    part.has_view = 0;
    part.fast = NULL;
    part.n = nh;
    if (part.raw)
        part.raw += h0;
    else
        part.items += h0;
    PyObject *res = NULL;
    Py_ssize_t n = nb < nh ? nb : nh;
    if ((bs.has_view ? blk_check(self, bs.ids + b0, n) : 0) == 0 &&
        pool_cache_pairs(self, bs.ids + b0, &part, n) == 0) {
        if (nb != nh)
            PyErr_Format(PyExc_ValueError, "cache_range: %zd blocks for %zd hashes", nb, nh);
        else if (self->nfresh >= NEW_HASHES_KEPT) {
            /* Forgets every refusal (Engine._admit): safe, only slower. */
            self->free_epoch++;
            pool_new_epoch_list(self);
            res = Py_None;
        }
        else
            res = Py_None;
    }
    Py_XINCREF(res);
    src_close(&hs);
    blk_close(&bs);
    return res;
}

static PyObject *pool_cache(PoolObject *self, PyObject *args)
{
    PyObject *block, *h;
    if (!PyArg_ParseTuple(args, "OO:cache", &block, &h))
        return NULL;
    PyObject *call = Py_BuildValue("([O][O]ii)", block, h, 0, 1);
    if (!call)
        return NULL;
    PyObject *r = pool_cache_range(self, call);
    Py_DECREF(call);
    return r;
}

static PyObject *pool_longest_hit(PoolObject *self, PyObject *args, PyObject *kwds)
{
    POOL_READY(self);
    static char *kwlist[] = {"hashes", "max_blocks", "likely", NULL};
    PyObject *hashes, *likely = Py_None;
    Py_ssize_t max_blocks;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On|O:longest_hit", kwlist, &hashes, &max_blocks,
                                     &likely))
        return NULL;
    /* `likely` is only a hint to the Python pool (a block there answers without a dict probe
     * exactly when the map would name it); a probe here is as cheap as checking it. */
    HashSrc src;
    if (src_open(&src, hashes, "longest_hit takes a sequence of hashes") < 0)
        return NULL;
    Py_ssize_t end = max_blocks < src.n ? max_blocks : src.n;
    PyObject *out = NULL;
    /* The blocks into ids, then into the array handed back. */
    int32_t *ids = PyMem_Malloc(sizeof(int32_t) * (size_t)(end > 0 ? end : 1));
    if (!ids) {
        PyErr_NoMemory();
        goto fail;
    }
    HashFeed feed;
    feed_init(&feed, &src, end, &self->by_hash);
    Py_ssize_t k = 0;
    for (; k < end; k++) {
        int64_t h;
        if (feed_get(&feed, k, &h) < 0)
            goto fail;
        int32_t b = hm_get(&self->by_hash, h);
        if (b < 0)
            break;
        ids[k] = b;
    }
    out = blocks_array(ids, k);
    if (!out)
        goto fail;
    PyMem_Free(ids);
    src_close(&src);
    return out;
fail:
    PyMem_Free(ids);
    Py_XDECREF(out);
    src_close(&src);
    return NULL;
}

static PyObject *pool_num_evictable(PoolObject *self, PyObject *arg)
{
    POOL_READY(self);
    BlockSrc src;
    if (blk_open_checked(self, &src, arg, "num_evictable takes an iterable of blocks") < 0)
        return NULL;
    Py_ssize_t c = 0;
    for (Py_ssize_t i = 0; i < src.n; i++)
        c += self->ref[src.ids[i]] <= 0;
    blk_close(&src);
    return PyLong_FromSsize_t(c);
}

static PyObject *pool_hash_of(PoolObject *self, PyObject *arg)
{
    POOL_READY(self);
    int32_t b;
    if (pool_block(self, arg, &b) < 0)
        return NULL;
    if (!self->has_hash[b])
        Py_RETURN_NONE;
    return PyLong_FromLongLong(self->hash[b]);
}

static PyObject *pool_free_queue(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    POOL_READY(self);
    PyObject *out = PyList_New(self->num_free);
    if (!out)
        return NULL;
    Py_ssize_t i = 0;
    for (uint64_t q = self->head; q != self->tail; q++)
        if (q_live(self, q))
            PyList_SET_ITEM(out, i++, Py_NewRef(INT_OF(self->ring[q & self->ring_mask])));
    return out;
}

static PyObject *pool_num_cached(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(self->num_hashed);
}

static PyObject *pool_num_evictable_cached(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    POOL_READY(self);
    Py_ssize_t c = 0;
    for (uint64_t q = self->head; q != self->tail; q++)
        if (q_live(self, q))
            c += self->has_hash[self->ring[q & self->ring_mask]];
    return PyLong_FromSsize_t(c);
}

static PyObject *pool_usage(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyFloat_FromDouble(1.0 - (double)self->num_free / (double)(self->num_blocks - 1));
}

static PyObject *pool_reset_prefix_cache(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    POOL_READY(self);
    if (self->num_free != self->num_blocks - 1)
        Py_RETURN_FALSE;
    memset(self->has_hash, 0, (size_t)self->num_blocks);
    memset(self->dup, 0xff, sizeof(int32_t) * (size_t)self->num_blocks);
    hm_clear(&self->by_hash);
    self->num_hashed = 0;
    self->free_epoch++;
    pool_new_epoch_list(self);
    if (self->tier != Py_None) {
        PyObject *r = tier_clear((KvTierObject *)self->tier, NULL);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_TRUE;
}

static PyObject *pool_snapshot(PoolObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{s:i,s:i,s:n,s:n}", "num_blocks", self->num_blocks, "block_size",
                         self->block_size, "free", self->num_free, "cached", self->num_hashed);
}

static PyObject *pool_get_num_free(PoolObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(self->num_free);
}

static PyObject *pool_get_num_usable(PoolObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromLong(self->num_blocks - 1);
}

static PyObject *pool_new_hashes_since(PoolObject *self, PyObject *arg);

static PyMethodDef pool_methods[] = {
    {"allocate", (PyCFunction)pool_allocate, METH_O,
     "Take n blocks from the head of the free queue, evicting their cached hashes."},
    {"allocate_one", (PyCFunction)pool_allocate_one, METH_NOARGS, "allocate(1)[0]."},
    {"touch", (PyCFunction)pool_touch, METH_O, "Take a reference on cache-hit blocks."},
    {"free", (PyCFunction)pool_free, METH_O, "Drop one reference per block, in eviction order."},
    {"free_cached", (PyCFunction)pool_free_cached, METH_O, "free() of blocks that carry a hash."},
    {"free_request", (PyCFunction)pool_free_request, METH_VARARGS,
     "free(reversed(blocks)) where exactly the first num_cached carry a hash."},
    {"cache", (PyCFunction)pool_cache, METH_VARARGS, "Register a full block's hash."},
    {"cache_range", (PyCFunction)pool_cache_range, METH_VARARGS,
     "cache(blocks[i], hashes[i]) for i in [start, end), in order."},
    {"longest_hit", (PyCFunction)(void (*)(void))pool_longest_hit, METH_VARARGS | METH_KEYWORDS,
     "Blocks of the longest cached prefix, at most max_blocks long."},
    {"num_evictable", (PyCFunction)pool_num_evictable, METH_O,
     "How many of blocks sit in the free queue."},
    {"hash_of", (PyCFunction)pool_hash_of, METH_O, "A block's hash, or None."},
    {"free_queue", (PyCFunction)pool_free_queue, METH_NOARGS, "The free queue, head first."},
    {"num_cached", (PyCFunction)pool_num_cached, METH_NOARGS, "Blocks that carry a hash."},
    {"num_evictable_cached", (PyCFunction)pool_num_evictable_cached, METH_NOARGS,
     "Free blocks that still hold a cached prefix."},
    {"usage", (PyCFunction)pool_usage, METH_NOARGS, "Fraction of usable blocks held."},
    {"reset_prefix_cache", (PyCFunction)pool_reset_prefix_cache, METH_NOARGS,
     "Forget every cached hash, the tiers' too; False while any request holds blocks."},
    {"snapshot", (PyCFunction)pool_snapshot, METH_NOARGS, "Counts, for the admin API."},
    {"new_hashes_since", (PyCFunction)pool_new_hashes_since, METH_O,
     "The hashes made findable in this free epoch from the k-th on, as an array('q')."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pool_members[] = {
    {"num_blocks", T_INT, offsetof(PoolObject, num_blocks), READONLY, NULL},
    {"block_size", T_INT, offsetof(PoolObject, block_size), READONLY, NULL},
    {"tier", T_OBJECT, offsetof(PoolObject, tier), READONLY, NULL},
    {"free_epoch", T_LONGLONG, offsetof(PoolObject, free_epoch), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *pool_get_new_hashes(PoolObject *self, void *Py_UNUSED(c))
{
    PyObject *out = PyList_New(self->nfresh);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < self->nfresh; i++) {
        PyObject *v = PyLong_FromLongLong(self->fresh[i]);
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *pool_get_num_new_hashes(PoolObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromSsize_t(self->nfresh);
}

static PyObject *pool_new_hashes_since(PoolObject *self, PyObject *arg)
{
    Py_ssize_t k = PyLong_AsSsize_t(arg);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (k < 0 || k > self->nfresh)
        k = k < 0 ? 0 : self->nfresh;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)(self->fresh + k),
                                              (Py_ssize_t)sizeof(int64_t) * (self->nfresh - k));
    if (!raw)
        return NULL;
    return hashes_array(raw);
}

static PyGetSetDef pool_getset[] = {
    {"new_hashes", (getter)pool_get_new_hashes, NULL, "new_hashes_since(0), as a list.", NULL},
    {"num_new_hashes", (getter)pool_get_num_new_hashes, NULL, NULL, NULL},
    {"num_free", (getter)pool_get_num_free, NULL, NULL, NULL},
    {"num_usable", (getter)pool_get_num_usable, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "thunder_mw.sim._kvblocks.BlockPool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "All KV blocks of one engine: reference counts, cached hashes and the free queue.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_members = pool_members,
    .tp_getset = pool_getset,
};

/* ------------------------------------------------------------------ chain hashes */

/* Python's hash((parent, tuple(block))) for the simulated engine's chain of block hashes
 * (sim/engine.py, Engine._hashes_upto), over token ids held as 32-bit unsigned ints. In
 * Python a block's tuple is made of int objects made from the array and freed again: ~25 ns a
 * token, a tenth of a long simulation. This is CPython's own arithmetic (Objects/tupleobject.c
 * tuplehash, the xxHash-style lanes since 3.8; Objects/longobject.c long_hash, sign times
 * |x| mod 2**61 - 1, -1 made -2); sim/native_blocks.py uses it only where it reproduces the
 * interpreter's hash() on sample blocks, so a Python that hashes otherwise runs the loop. */
#define XXPRIME_1 ((uint64_t)11400714785074694791ULL)
#define XXPRIME_2 ((uint64_t)14029467366897019727ULL)
#define XXPRIME_5 ((uint64_t)2870177450012600261ULL)
#define XXROTATE(x) (((x) << 31) | ((x) >> 33))
#define HASH_MODULUS (((uint64_t)1 << 61) - 1)

static inline uint64_t xx_lane(uint64_t acc, uint64_t lane)
{
    acc += lane * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

static inline uint64_t xx_end(uint64_t acc, uint64_t len)
{
    acc += len ^ (XXPRIME_5 ^ 3527539ULL);
    return acc == (uint64_t)-1 ? (uint64_t)1546275796 : acc;
}

/* hash(x) of an int x in int64's range. */
static inline uint64_t int_hash(int64_t x)
{
    uint64_t mag = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    int64_t h = (int64_t)(mag % HASH_MODULUS);
    if (x < 0)
        h = -h;
    return (uint64_t)(h == -1 ? -2 : h);
}

/* hash((parent, block)) given the block tuple's own hash: a 2-tuple's lanes. */
static inline int64_t chain_step(int64_t parent, uint64_t block)
{
    return (int64_t)xx_end(xx_lane(xx_lane(XXPRIME_5, int_hash(parent)), block), 2);
}

static PyObject *chain_hashes(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *parent_obj, *ids;
    Py_ssize_t start, stop, bs;
    if (!PyArg_ParseTuple(args, "OOnnn:chain_hashes", &parent_obj, &ids, &start, &stop, &bs))
        return NULL;
    int64_t parent;
    if (get_i64(parent_obj, &parent) < 0)
        return NULL;
    Py_buffer view;
    if (!view_of(ids, &view, 4, "I", NULL)) {
        PyErr_SetString(PyExc_TypeError, "chain_hashes reads token ids from an array('I')");
        return NULL;
    }
    Py_ssize_t n = view.len / 4;
    if (bs < 1 || start < 0 || stop < start || stop > n || (stop - start) % bs) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError,
                     "chain_hashes: tokens [%zd, %zd) are not whole blocks of %zd within %zd",
                     start, stop, bs, n);
        return NULL;
    }
    Py_ssize_t blocks = (stop - start) / bs;
    PyObject *raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int64_t) * blocks);
    if (!raw) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(raw);
    const uint32_t *tok = (const uint32_t *)view.buf + start;
    for (Py_ssize_t k = 0; k < blocks; k++, tok += bs) {
        uint64_t block = XXPRIME_5;
        for (Py_ssize_t j = 0; j < bs; j++)
            block = xx_lane(block, tok[j]); /* hash(v) is v for 0 <= v < 2**32 */
        parent = chain_step(parent, xx_end(block, (uint64_t)bs));
        out[k] = parent;
    }
    PyBuffer_Release(&view);
    return hashes_array(raw);
}

/* The chain over blocks known by their own hashes (an engine's output blocks: the filler
 * block at offset o has hash(tuple) block_hashes[o]): block j is block_hashes[(first + j *
 * step) % len]. */
static PyObject *chain_cycle(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *parent_obj, *lanes;
    Py_ssize_t first, step, count;
    if (!PyArg_ParseTuple(args, "OOnnn:chain_cycle", &parent_obj, &lanes, &first, &step, &count))
        return NULL;
    int64_t parent;
    if (get_i64(parent_obj, &parent) < 0)
        return NULL;
    Py_buffer view;
    if (!view_of(lanes, &view, 8, "q", "l")) {
        PyErr_SetString(PyExc_TypeError, "chain_cycle reads block hashes from an array('q')");
        return NULL;
    }
    Py_ssize_t m = view.len / 8;
    if (m < 1 || first < 0 || step < 0 || count < 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError,
                     "chain_cycle: %zd blocks from offset %zd by %zd over %zd block hashes",
                     count, first, step, m);
        return NULL;
    }
    PyObject *raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int64_t) * count);
    if (!raw) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(raw);
    const int64_t *lane = (const int64_t *)view.buf;
    Py_ssize_t o = first % m;
    step %= m;
    for (Py_ssize_t k = 0; k < count; k++) {
        parent = chain_step(parent, (uint64_t)lane[o]);
        out[k] = parent;
        o += step;
        if (o >= m)
            o -= m;
    }
    PyBuffer_Release(&view);
    return hashes_array(raw);
}

/* start + x + x + ... (k times), one addition at a time in that order: the time of k block
 * loads as the engine adds them (sim/engine.py, Engine._load_from_tiers). In Python that was
 * functools.reduce over k float objects; here one register. No reassociation: the extension
 * is built without -ffast-math, and each sum is rounded to a double (FLT_EVAL_METHOD 0, as on
 * SSE2; elsewhere through memory). */
static PyObject *repeat_add(PyObject *Py_UNUSED(module), PyObject *args)
{
    double sum, x;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "ddn:repeat_add", &sum, &x, &k))
        return NULL;
    if (k < 0) {
        PyErr_Format(PyExc_ValueError, "repeat_add: %zd additions", k);
        return NULL;
    }
#if FLT_EVAL_METHOD == 0
    double acc = sum;
#else
    volatile double acc = sum; /* each sum rounded to a double, as Python's floats are */
#endif
    for (Py_ssize_t i = 0; i < k; i++)
        acc = acc + x;
    return PyFloat_FromDouble(acc);
}

static PyMethodDef module_methods[] = {
    {"repeat_add", (PyCFunction)repeat_add, METH_VARARGS,
     "repeat_add(start, x, k) -> float: start + x + ... + x, k additions in order."},
    {"chain_hashes", (PyCFunction)chain_hashes, METH_VARARGS,
     "chain_hashes(parent, ids, start, stop, block_size) -> array('q'): each whole block's "
     "hash((parent, tuple(block))) of ids[start:stop], each the next one's parent."},
    {"chain_cycle", (PyCFunction)chain_cycle, METH_VARARGS,
     "chain_cycle(parent, block_hashes, first, step, count) -> array('q'): the chain over "
     "`count` blocks whose own hashes are block_hashes[(first + j * step) % len]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kvblocks_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "thunder_mw.sim._kvblocks",
    .m_doc = "The simulated engine's KV block pool and host tier, in C (see sim/kv_cache.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__kvblocks(void)
{
    if (PyType_Ready(&KvTierType) < 0 || PyType_Ready(&PoolType) < 0)
        return NULL;
    if (!array_type) {
        PyObject *mod = PyImport_ImportModule("array");
        if (!mod)
            return NULL;
        array_type = PyObject_GetAttrString(mod, "array");
        Py_DECREF(mod);
        typecode_int = PyUnicode_InternFromString("i");
        typecode_hash = PyUnicode_InternFromString("q");
        if (!array_type || !typecode_int || !typecode_hash)
            return NULL;
        if (sizeof(int) != sizeof(int32_t)) {
            PyErr_SetString(PyExc_ImportError, "array('i') is not 32 bits here");
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&kvblocks_module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "KvTier", (PyObject *)&KvTierType) < 0 ||
        PyModule_AddObjectRef(m, "BlockPool", (PyObject *)&PoolType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
