/* stepscope.ingest._scan: one SQLite query of integer columns into caller-owned buffers.
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
    for (int c = 0; c < ncols; c++) null_counts[c] = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (n >= cap) {
            status = SCAN_FULL;
            goto done;
        }
        for (int c = 0; c < ncols; c++) {
            int t = sqlite3_column_type(st, c);
            if (t == SQLITE_INTEGER) {
                values[c][n] = sqlite3_column_int64(st, c);
                if (null_counts[c]) nulls[c][n] = 0;
            } else if (t == SQLITE_NULL) {
                if (!null_counts[c]) memset(nulls[c], 0, (size_t)n);
                values[c][n] = 0;
                nulls[c][n] = 1;
                null_counts[c]++;
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

static PyObject *scan(PyObject *self, PyObject *args) {
    const char *uri, *sql;
    PyObject *values, *nulls;
    if (!PyArg_ParseTuple(args, "ssO!O!", &uri, &sql, &PyTuple_Type, &values, &PyTuple_Type, &nulls)) return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(values);
    if (ncols < 1 || ncols > 256 || PyTuple_GET_SIZE(nulls) != ncols) {
        PyErr_SetString(PyExc_ValueError, "values and nulls: one buffer each per column (1 to 256)");
        return NULL;
    }
    Py_buffer vb[256], nb[256];
    int64_t *vp[256];
    uint8_t *np_[256];
    Py_ssize_t counts[256];
    Py_ssize_t cap = -1, ncap = -1, rows = 0;
    if (take_buffers(values, vb, (int)ncols, 8, &cap) < 0) return NULL;
    if (take_buffers(nulls, nb, (int)ncols, 1, &ncap) < 0) {
        for (int i = 0; i < ncols; i++) PyBuffer_Release(&vb[i]);
        return NULL;
    }
    if (ncap < cap) cap = ncap;
    for (int i = 0; i < ncols; i++) {
        vp[i] = (int64_t *)vb[i].buf;
        np_[i] = (uint8_t *)nb[i].buf;
    }
    char err[512] = {0};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan_rows(uri, sql, (int)ncols, vp, np_, counts, cap, &rows, err, sizeof err);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < ncols; i++) {
        PyBuffer_Release(&vb[i]);
        PyBuffer_Release(&nb[i]);
    }
    switch (status) {
    case SCAN_TYPE:
        PyErr_SetString(NotIntegers, "a value that is neither an integer nor NULL");
        return NULL;
    case SCAN_FULL:
        PyErr_Format(PyExc_OverflowError, "more than %zd rows", cap);
        return NULL;
    case SCAN_ERROR:
        PyErr_SetString(PyExc_RuntimeError, err);
        return NULL;
    }
    PyObject *nc = PyTuple_New(ncols);
    if (!nc) return NULL;
    for (int i = 0; i < ncols; i++) PyTuple_SET_ITEM(nc, i, PyLong_FromSsize_t(counts[i]));
    return Py_BuildValue("(nN)", rows, nc);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(uri, sql, values, nulls) -> (rows, null_counts)"},
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
