/* stepscope.ingest._scan: one SQLite query of integer columns into caller-owned buffers, by
 * SQLite (scan) or from the table's own pages (pages, below).
 *
 * Why it exists: the reader's big tables (a million kernels, two million API calls) are
 * columns of integers. ADBC's driver reads them on a connection opened in SQLite's serialized
 * mode, where every sqlite3_column_* call takes and releases the connection's mutex, and appends
 * each value to a growing Arrow buffer that polars then copies. A connection opened with
 * SQLITE_OPEN_NOMUTEX (each reader thread has its own) and values written straight into
 * preallocated arrays read the same rows in about four fifths of the time (docs/PERFORMANCE.md,
 * round five: SQLite's own stepping is most of what is left). The module is optional: without
 * it (no compiler at install time) the ADBC path reads everything, with the same result.
 *
 * scan(uri, sql, values, nulls) -> (rows, null_counts)
 *   values: one writable buffer of int64 per selected column (its capacity bounds the rows);
 *   nulls:  one writable buffer of uint8 per column, the same capacity; nulls[c] is written
 *           only from the first NULL of column c on (0 before, 1 at a NULL), so a column
 *           without NULL never touches its pages.
 * Raises _scan.NotIntegers when a value is neither an integer nor NULL (the caller reads the
 * table again with its typed query; its own exception, so that a TypeError of the arguments is
 * not taken for one), OverflowError when there are more rows than the buffers hold, and
 * RuntimeError with SQLite's message otherwise. The GIL is released while SQLite steps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sqlite3.h>
#include <stdint.h>
#include <string.h>

enum { SCAN_OK = 0, SCAN_ERROR = 1, SCAN_TYPE = 2, SCAN_FULL = 3 };

static PyObject *NotIntegers;

/* Row n of output column c. The NULL flags are written only from a column's first NULL on (the
 * flags of the rows before it zeroed then), so a column without NULL never touches its pages. */
static inline void put_int(int64_t *values, uint8_t *nulls, Py_ssize_t null_count, Py_ssize_t n, int64_t x) {
    values[n] = x;
    if (null_count) nulls[n] = 0;
}

static inline void put_null(int64_t *values, uint8_t *nulls, Py_ssize_t *null_count, Py_ssize_t n) {
    if (!*null_count) memset(nulls, 0, (size_t)n);
    values[n] = 0;
    nulls[n] = 1;
    (*null_count)++;
}

/* null_counts: zeroed by the caller (outputs_take) */
static int scan_rows(const char *uri, const char *sql, int ncols, int64_t **values, uint8_t **nulls,
                     Py_ssize_t *null_counts, Py_ssize_t cap, Py_ssize_t *rows, char *err, size_t errlen) {
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    Py_ssize_t n = 0;
    int status = SCAN_OK, rc;

    rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) goto fail;
    sqlite3_busy_timeout(db, 5000); /* as sqlite3.connect's default timeout */
    rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) goto fail;
    if (sqlite3_column_count(st) != ncols) {
        snprintf(err, errlen, "the query selects %d columns, %d buffers given", sqlite3_column_count(st), ncols);
        status = SCAN_ERROR;
        goto done;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n >= cap) {
            status = SCAN_FULL;
            goto done;
        }
        for (int c = 0; c < ncols; c++) {
            int t = sqlite3_column_type(st, c);
            if (t == SQLITE_INTEGER) {
                put_int(values[c], nulls[c], null_counts[c], n, sqlite3_column_int64(st, c));
            } else if (t == SQLITE_NULL) {
                put_null(values[c], nulls[c], &null_counts[c], n);
            } else {
                status = SCAN_TYPE;
                goto done;
            }
        }
        n++;
    }
    if (rc == SQLITE_DONE) goto done;
fail:
    snprintf(err, errlen, "%s", db ? sqlite3_errmsg(db) : "out of memory opening the database");
    status = SCAN_ERROR;
done:
    if (st) sqlite3_finalize(st);
    if (db) sqlite3_close(db);
    *rows = n;
    return status;
}

static int take_buffers(PyObject *seq, Py_buffer *views, int n, Py_ssize_t itemsize, Py_ssize_t *cap) {
    for (int i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(seq, i);
        if (PyObject_GetBuffer(o, &views[i], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            for (int j = 0; j < i; j++) PyBuffer_Release(&views[j]);
            return -1;
        }
        Py_ssize_t items = views[i].len / itemsize;
        if (*cap < 0 || items < *cap) *cap = items;
    }
    return 0;
}

/* the output buffers of one call (values and NULL flags per column), and its result */
typedef struct {
    Py_buffer vb[256], nb[256];
    int64_t *vp[256];
    uint8_t *np[256];
    Py_ssize_t counts[256];
    Py_ssize_t cap;
    int ncols;
} outputs;

static int outputs_take(outputs *o, PyObject *values, PyObject *nulls) {
    Py_ssize_t ncap = -1;
    o->cap = -1;
    if (take_buffers(values, o->vb, o->ncols, 8, &o->cap) < 0) return -1;
    if (take_buffers(nulls, o->nb, o->ncols, 1, &ncap) < 0) {
        for (int i = 0; i < o->ncols; i++) PyBuffer_Release(&o->vb[i]);
        return -1;
    }
    if (ncap < o->cap) o->cap = ncap;
    for (int i = 0; i < o->ncols; i++) {
        o->vp[i] = (int64_t *)o->vb[i].buf;
        o->np[i] = (uint8_t *)o->nb[i].buf;
        o->counts[i] = 0;
    }
    return 0;
}

/* releases the buffers; (rows, null_counts), or the exception `status` stands for */
static PyObject *outputs_result(outputs *o, int status, const char *err, Py_ssize_t rows) {
    for (int i = 0; i < o->ncols; i++) {
        PyBuffer_Release(&o->vb[i]);
        PyBuffer_Release(&o->nb[i]);
    }
    switch (status) {
    case SCAN_TYPE:
        PyErr_SetString(NotIntegers, "a value that is neither an integer nor NULL");
        return NULL;
    case SCAN_FULL:
        PyErr_Format(PyExc_OverflowError, "more than %zd rows", o->cap);
        return NULL;
    case SCAN_ERROR:
        PyErr_SetString(PyExc_RuntimeError, err);
        return NULL;
    }
    PyObject *nc = PyTuple_New(o->ncols);
    if (!nc) return NULL;
    for (int i = 0; i < o->ncols; i++) PyTuple_SET_ITEM(nc, i, PyLong_FromSsize_t(o->counts[i]));
    return Py_BuildValue("(nN)", rows, nc);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    const char *uri, *sql;
    PyObject *values, *nulls;
    if (!PyArg_ParseTuple(args, "ssO!O!", &uri, &sql, &PyTuple_Type, &values, &PyTuple_Type, &nulls)) return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(values);
    if (ncols < 1 || ncols > 256 || PyTuple_GET_SIZE(nulls) != ncols) {
        PyErr_SetString(PyExc_ValueError, "values and nulls: one buffer each per column (1 to 256)");
        return NULL;
    }
    outputs o = {.ncols = (int)ncols};
    if (outputs_take(&o, values, nulls) < 0) return NULL;
    char err[512] = {0};
    Py_ssize_t rows = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan_rows(uri, sql, o.ncols, o.vp, o.np, o.counts, o.cap, &rows, err, sizeof err);
    Py_END_ALLOW_THREADS
    return outputs_result(&o, status, err, rows);
}

/* ---------------------------------------------------------------------------------------------
 * pages(path, root, fields, filters, lo, hi, values, nulls) -> (rows, null_counts)
 *
 * The same read as scan() of `SELECT <fields> FROM <table> WHERE <filters> AND rowid > lo AND
 * rowid <= hi`, taken from the table's B-tree pages in the file itself instead of through
 * SQLite's virtual machine, which is most of what scan() costs (docs/PERFORMANCE.md, round six).
 * Only the simplest layout is read: a rowid table whose rows fit their page, in a file no
 * writer touches while it is read. Anything else - an overflow page, a record without a field
 * asked for, a page that is not what a table's B-tree holds, a file that changed - raises
 * RuntimeError, and the caller reads the slice with scan(), that is with SQLite.
 *   root:    the table's root page (sqlite_master.rootpage);
 *   fields:  per output column, the record field it is (-1: NULL, -2: the rowid);
 *   filters: ((field, (int, ...)), ...): a row is kept when each such field holds an integer of
 *            its tuple (NULL and other types never equal one, as in `field IN (...)` on a column
 *            of INTEGER affinity);
 *   lo, hi:  the rowids read, lo excluded (lo = -2^63: no lower bound);
 *   values, nulls, the result and NotIntegers / OverflowError: as scan().
 * The GIL is released while pages are read.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__APPLE__)
#define MTIME_NS(s) ((int64_t)(s).st_mtimespec.tv_sec * 1000000000 + (s).st_mtimespec.tv_nsec)
#else
#define MTIME_NS(s) ((int64_t)(s).st_mtim.tv_sec * 1000000000 + (s).st_mtim.tv_nsec)
#endif

enum { PG_MAX_DEPTH = 20, PG_BATCH = 32, PG_MAX_FIELDS = 2000, PG_MAX_FILTERS = 8 };

typedef struct {
    int field;
    int n;
    int64_t *set; /* sorted */
} pg_filter;

typedef struct {
    int fd;
    uint32_t page_size, usable, npages;
    uint64_t visited;
    int ncols, nfilters, nfields; /* nfields: the record fields a row must have */
    const int *fields;
    pg_filter *filters;
    int64_t lo, hi;
    int64_t **values;
    uint8_t **nulls;
    Py_ssize_t *null_counts, cap, n;
    int status;
    char *err;
    size_t errlen;
} pg_reader;

static uint32_t be16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* SQLite's varint: 1-9 bytes, big-endian groups of 7 bits, the 9th byte whole. 0 past `end`. */
static int varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 9; i++) {
        if (p >= end) return 0;
        uint8_t b = *p++;
        if (i == 8) {
            v = (v << 8) | b;
            break;
        }
        v = (v << 7) | (b & 0x7f);
        if (!(b & 0x80)) break;
    }
    *pp = p;
    *out = v;
    return 1;
}

static int pg_fail(pg_reader *r, const char *what, uint32_t pgno) {
    if (r->status == SCAN_OK) {
        r->status = SCAN_ERROR;
        if (pgno) snprintf(r->err, r->errlen, "page %u: %s", pgno, what);
        else snprintf(r->err, r->errlen, "%s", what);
    }
    return -1;
}

static int64_t serial_int(const uint8_t *p, uint64_t t) {
    switch (t) {
    case 1: return (int8_t)p[0];
    case 2: return (int16_t)be16(p);
    case 3: return ((int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8))) >> 8;
    case 4: return (int32_t)be32(p);
    case 5: return ((int64_t)(((uint64_t)be16(p) << 48) | ((uint64_t)be32(p + 2) << 16))) >> 16;
    case 6: return (int64_t)(((uint64_t)be32(p) << 32) | be32(p + 4));
    case 8: return 0;
    default: return 1; /* 9 */
    }
}

static uint64_t serial_size(uint64_t t) {
    static const uint8_t sizes[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, 0, 0};
    return t < 12 ? sizes[t] : (t - 12) / 2;
}

#define IS_INT(t) (((t) >= 1 && (t) <= 6) || (t) == 8 || (t) == 9)

static int in_set(const pg_filter *f, int64_t v) {
    int a = 0, b = f->n;
    while (a < b) {
        int m = (a + b) / 2;
        if (f->set[m] < v) a = m + 1;
        else b = m;
    }
    return a < f->n && f->set[a] == v;
}

/* one row: its record (`rec`, `size` bytes, all on the page) and rowid */
static int pg_row(pg_reader *r, const uint8_t *rec, uint64_t size, int64_t rowid, uint32_t pgno) {
    uint64_t types[PG_MAX_FIELDS];
    uint64_t offs[PG_MAX_FIELDS];
    const uint8_t *end = rec + size, *h = rec;
    uint64_t hsize;
    if (!varint(&h, end, &hsize) || hsize > size || hsize < (uint64_t)(h - rec))
        return pg_fail(r, "a record's header overruns it", pgno);
    const uint8_t *hend = rec + hsize;
    uint64_t off = hsize;
    int nf = 0;
    /* the whole header, and its values must fill the record exactly: a record SQLite might
     * read otherwise (or call malformed) is left to SQLite */
    while (h < hend) {
        uint64_t t;
        if (!varint(&h, hend, &t) || t == 10 || t == 11 || t > 0xffffffffu)
            return pg_fail(r, "a record's header is malformed", pgno);
        if (nf < r->nfields) {
            types[nf] = t;
            offs[nf] = off;
            nf++;
        }
        off += serial_size(t);
    }
    if (off != size) return pg_fail(r, "a record's values do not fill it", pgno);
    if (nf < r->nfields) return pg_fail(r, "a record without a field asked for", pgno);
    for (int i = 0; i < r->nfilters; i++) {
        const pg_filter *f = &r->filters[i];
        uint64_t t = types[f->field];
        if (!IS_INT(t) || !in_set(f, serial_int(rec + offs[f->field], t))) return 0;
    }
    if (r->n >= r->cap) {
        r->status = SCAN_FULL;
        return -1;
    }
    Py_ssize_t n = r->n;
    for (int c = 0; c < r->ncols; c++) {
        int fi = r->fields[c];
        uint64_t t = fi == -2 ? 1 : fi < 0 ? 0 : types[fi];
        if (IS_INT(t)) {
            put_int(r->values[c], r->nulls[c], r->null_counts[c], n, fi == -2 ? rowid : serial_int(rec + offs[fi], t));
        } else if (t == 0) {
            put_null(r->values[c], r->nulls[c], &r->null_counts[c], n);
        } else {
            r->status = SCAN_TYPE;
            return -1;
        }
    }
    r->n = n + 1;
    return 0;
}

static int pg_read(pg_reader *r, uint32_t first, uint32_t count, uint8_t *buf) {
    size_t len = (size_t)count * r->page_size;
    off_t at = (off_t)(first - 1) * r->page_size;
    size_t got = 0;
    while (got < len) {
        ssize_t k = pread(r->fd, buf + got, len - got, at + (off_t)got);
        if (k <= 0) return pg_fail(r, k == 0 ? "past the end of the file" : "unreadable", first);
        got += (size_t)k;
    }
    return 0;
}

static int pg_page(pg_reader *r, uint32_t pgno, const uint8_t *p, int depth);

/* the pages `kids` (in order), read PG_BATCH consecutive ones at a time */
static int pg_children(pg_reader *r, const uint32_t *kids, int nkids, int depth) {
    uint8_t *buf = malloc((size_t)PG_BATCH * r->page_size);
    if (!buf) return pg_fail(r, "out of memory", kids[0]);
    int rc = 0;
    for (int i = 0; i < nkids && rc == 0;) {
        int run = 1;
        while (i + run < nkids && run < PG_BATCH && kids[i + run] == kids[i] + (uint32_t)run) run++;
        rc = pg_read(r, kids[i], (uint32_t)run, buf);
        for (int j = 0; j < run && rc == 0; j++) rc = pg_page(r, kids[i + j], buf + (size_t)j * r->page_size, depth);
        i += run;
    }
    free(buf);
    return rc;
}

static int pg_page(pg_reader *r, uint32_t pgno, const uint8_t *p, int depth) {
    if (depth > PG_MAX_DEPTH || ++r->visited > r->npages) return pg_fail(r, "the table's tree is too deep", pgno);
    uint32_t hdr = pgno == 1 ? 100 : 0;
    uint8_t type = p[hdr];
    uint32_t ncells = be16(p + hdr + 3);
    uint32_t ptrs = hdr + (type == 13 ? 8 : 12);
    if (type != 13 && type != 5) return pg_fail(r, "not a page of a table's tree", pgno);
    if (ptrs + 2 * ncells > r->usable) return pg_fail(r, "more cells than the page holds", pgno);
    if (depth > 0 && ncells == 0) return pg_fail(r, "an empty page below the root", pgno); /* SQLite: corrupt */
    const uint8_t *end = p + r->usable;
    if (type == 13) {
        uint64_t maxlocal = r->usable - 35;
        for (uint32_t i = 0; i < ncells; i++) {
            uint32_t off = be16(p + ptrs + 2 * i);
            if (off < ptrs + 2 * ncells || off >= r->usable) return pg_fail(r, "a cell outside its page", pgno);
            const uint8_t *c = p + off;
            uint64_t size, key;
            if (!varint(&c, end, &size) || !varint(&c, end, &key)) return pg_fail(r, "a cell outside its page", pgno);
            int64_t rowid = (int64_t)key;
            if ((r->lo != INT64_MIN && rowid <= r->lo) || rowid > r->hi) continue;
            if (size > maxlocal) return pg_fail(r, "a row continued on an overflow page", pgno);
            if (size > (uint64_t)(end - c)) return pg_fail(r, "a cell outside its page", pgno);
            if (pg_row(r, c, size, rowid, pgno) < 0) return -1;
        }
        return 0;
    }
    /* interior: child i holds the rowids up to key i (and above key i-1); the right-most child
     * the rest. Only the children whose rowids can meet (lo, hi] are read. */
    uint32_t *kids = malloc(sizeof(uint32_t) * (ncells + 1));
    if (!kids) return pg_fail(r, "out of memory", pgno);
    int nkids = 0, past = 0;
    for (uint32_t i = 0; i < ncells && !past; i++) {
        uint32_t off = be16(p + ptrs + 2 * i);
        if (off < ptrs + 2 * ncells || off + 4 >= r->usable) {
            free(kids);
            return pg_fail(r, "a cell outside its page", pgno);
        }
        const uint8_t *c = p + off + 4;
        uint64_t key;
        if (!varint(&c, end, &key)) {
            free(kids);
            return pg_fail(r, "a cell outside its page", pgno);
        }
        uint32_t child = be32(p + off);
        if (r->lo == INT64_MIN || (int64_t)key > r->lo) kids[nkids++] = child;
        if ((int64_t)key >= r->hi) past = 1;
    }
    if (!past) kids[nkids++] = be32(p + hdr + 8);
    for (int i = 0; i < nkids; i++)
        if (kids[i] < 1 || kids[i] > r->npages) {
            free(kids);
            return pg_fail(r, "a child page past the end of the file", pgno);
        }
    int rc = nkids ? pg_children(r, kids, nkids, depth + 1) : 0;
    free(kids);
    return rc;
}

static int pg_header(pg_reader *r, uint8_t *h, struct stat *st) {
    if (fstat(r->fd, st) != 0) return pg_fail(r, "cannot stat the file", 0);
    if (pread(r->fd, h, 100, 0) != 100 || memcmp(h, "SQLite format 3", 16) != 0)
        return pg_fail(r, "not an SQLite file", 0);
    uint32_t ps = be16(h + 16);
    if (ps == 1) ps = 65536;
    if (ps < 512 || ps > 65536 || (ps & (ps - 1))) return pg_fail(r, "a page size SQLite does not write", 0);
    if (h[20] > ps - 480) return pg_fail(r, "too many reserved bytes", 0);
    r->page_size = ps;
    r->usable = ps - h[20];
    /* SQLite's count of pages: the header's, when valid (written by the same change as the
     * change counter), else the file's; a header that claims more than the file is corrupt */
    uint64_t in_file = (uint64_t)st->st_size / ps, in_header = be32(h + 28);
    if (in_header == 0 || memcmp(h + 24, h + 92, 4) != 0) in_header = in_file;
    if (in_header > in_file || in_header > 0xffffffffu)
        return pg_fail(r, "the header counts more pages than the file has", 0);
    r->npages = (uint32_t)in_header;
    return 0;
}

static int pages_rows(const char *path, uint32_t root, pg_reader *r) {
    uint8_t h0[100], h1[100];
    struct stat s0, s1;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) return pg_fail(r, "cannot open the file", 0);
    int rc = pg_header(r, h0, &s0);
    if (rc == 0 && (root < 2 || root > r->npages)) rc = pg_fail(r, "the root page is past the end of the file", root);
    if (rc == 0) {
        uint8_t *buf = malloc(r->page_size);
        rc = buf ? pg_read(r, root, 1, buf) : pg_fail(r, "out of memory", root);
        if (rc == 0) rc = pg_page(r, root, buf, 0);
        free(buf);
    }
    /* a writer that committed meanwhile (its change counter, the file's size or time moved):
     * what was read may mix two states, so SQLite reads it instead */
    if (rc == 0 && (pg_header(r, h1, &s1) != 0 || memcmp(h0 + 24, h1 + 24, 4) != 0 || s0.st_size != s1.st_size ||
                    MTIME_NS(s0) != MTIME_NS(s1)))
        rc = pg_fail(r, "the file changed while it was read", 0);
    close(r->fd);
    return rc;
}

static PyObject *pages(PyObject *self, PyObject *args) {
    const char *path;
    unsigned int root;
    PyObject *fields, *filters, *values, *nulls;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "sIO!O!LLO!O!", &path, &root, &PyTuple_Type, &fields, &PyTuple_Type, &filters, &lo, &hi,
                          &PyTuple_Type, &values, &PyTuple_Type, &nulls))
        return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(values);
    if (ncols < 1 || ncols > 256 || PyTuple_GET_SIZE(nulls) != ncols || PyTuple_GET_SIZE(fields) != ncols) {
        PyErr_SetString(PyExc_ValueError, "fields, values and nulls: one each per column (1 to 256)");
        return NULL;
    }
    Py_ssize_t nfilters = PyTuple_GET_SIZE(filters);
    if (nfilters > PG_MAX_FILTERS) {
        PyErr_SetString(PyExc_ValueError, "too many filters");
        return NULL;
    }
    int fidx[256];
    pg_filter flt[PG_MAX_FILTERS];
    int nfields = 0, nflt = 0;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        long f = PyLong_AsLong(PyTuple_GET_ITEM(fields, i));
        if (f == -1 && PyErr_Occurred()) return NULL;
        if (f < -2 || f >= PG_MAX_FIELDS) {
            PyErr_SetString(PyExc_ValueError, "a field out of range");
            return NULL;
        }
        fidx[i] = (int)f;
        if (f + 1 > nfields) nfields = (int)f + 1;
    }
    for (Py_ssize_t i = 0; i < nfilters; i++, nflt++) {
        PyObject *t = PyTuple_GET_ITEM(filters, i), *set;
        long f;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "lO!", &f, &PyTuple_Type, &set)) goto out;
        if (f < 0 || f >= PG_MAX_FIELDS) {
            PyErr_SetString(PyExc_ValueError, "a filter's field out of range");
            goto out;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(set);
        flt[i].field = (int)f;
        flt[i].n = (int)n;
        flt[i].set = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        if (!flt[i].set) {
            PyErr_NoMemory();
            goto out;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(set, j));
            if (v == -1 && PyErr_Occurred()) {
                free(flt[i].set);
                goto out;
            }
            int64_t x = v;
            Py_ssize_t k = j; /* insertion: the sets are small (API name ids) */
            while (k > 0 && flt[i].set[k - 1] > x) {
                flt[i].set[k] = flt[i].set[k - 1];
                k--;
            }
            flt[i].set[k] = x;
        }
        if (f + 1 > nfields) nfields = (int)f + 1;
    }
    {
        outputs o = {.ncols = (int)ncols};
        if (outputs_take(&o, values, nulls) < 0) goto out;
        char err[512] = {0};
        pg_reader r = {.fd = -1, .ncols = (int)ncols, .nfilters = nflt, .nfields = nfields, .fields = fidx,
                       .filters = flt, .lo = lo, .hi = hi, .values = o.vp, .nulls = o.np, .null_counts = o.counts,
                       .cap = o.cap, .n = 0, .status = SCAN_OK, .err = err, .errlen = sizeof err};
        Py_BEGIN_ALLOW_THREADS
        pages_rows(path, root, &r);
        Py_END_ALLOW_THREADS
        result = outputs_result(&o, r.status, err, r.n);
    }
out:
    for (int i = 0; i < nflt; i++) free(flt[i].set);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(uri, sql, values, nulls) -> (rows, null_counts)"},
    {"pages", pages, METH_VARARGS, "pages(path, root, fields, filters, lo, hi, values, nulls) -> (rows, null_counts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    NotIntegers = PyErr_NewException("stepscope.ingest._scan.NotIntegers", NULL, NULL);
    if (!NotIntegers || PyModule_AddObjectRef(m, "NotIntegers", NotIntegers) < 0) {
        Py_XDECREF(NotIntegers);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
