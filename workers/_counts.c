/* A read's requests counted, in C: into a worker's request counters in the shared block and
 * into the event log's per-second aggregate (workers/counts.py holds the same in Python, the
 * oracle, used where this is not built).
 *
 * count_requests(words, cells, bounds, listener, api_keys, elapsed_ns) -> None
 *
 * `words` is a writable buffer of format 'q' (the shared block's words); `cells[listener]` a
 * tuple of three ints (requests, buckets, duration): the indexes of API 0's request count, of
 * its first duration bucket and of its duration sum on that listener, each API's cells
 * following API 0's (len(bounds) + 1 buckets per API); `bounds` the buckets' upper bounds in
 * nanoseconds, a tuple in ascending order; `api_keys` a list of ints, the key of each request
 * of a read, answered `elapsed_ns` (an int) after it arrived.  For each API in 0..127 with n
 * requests in the list, in ascending order of key:
 *
 *     words[requests + key] += n
 *     words[buckets + key * (len(bounds) + 1) + bisect_left(bounds, elapsed_ns)] += n
 *     words[duration + key] += elapsed_ns * n
 *
 * Keys outside 0..127 are not counted.  An index is taken as Python takes a sequence's (a
 * negative one counts from the end); an index outside the buffer raises IndexError and a sum
 * outside the format's range ValueError, each at the step where the Python walk raises it, the
 * steps before it done.  The arguments' types are checked before any word is written.
 *
 * aggregate(entry, requests, bytes_in, bytes_out, us) -> None
 *
 * adds to `entry`, an aggregate of the event log - a writable buffer of format 'q' (an
 * array): count, bytes in, bytes out, latency sum, then SKETCH_BUCKETS sketch counts -
 * `requests` requests that moved `bytes_in` and `bytes_out` bytes and were each answered `us`
 * microseconds after they arrived, all four ints of 8 bytes (else OverflowError, nothing
 * added):
 *
 *     entry[0] += requests; entry[1] += bytes_in; entry[2] += bytes_out
 *     entry[3] += us * requests; entry[4 + latency_bucket(us)] += requests
 *
 * latency_bucket being broker.shared.events.latency_bucket capped at SKETCH_BUCKETS - 1.  As
 * the array would, an index past its end raises IndexError and a sum past 8 bytes
 * OverflowError, at that step, the steps before it done.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define API_KEYS 128
#define SKETCH_BUCKETS 192  /* up to about 2**47 us; slower requests count in the last one */

/* An int as a long long; *overflow nonzero (and *value 0) when it does not fit one. */
static int as_long_long(PyObject *number, long long *value, int *overflow)
{
    *value = PyLong_AsLongLongAndOverflow(number, overflow);
    if (*value == -1 && !*overflow && PyErr_Occurred())
        return -1;
    if (*overflow)
        *value = 0;
    return 0;
}

/* --- count_requests ----------------------------------------------------------------------- */

/* The buffer's word at `index` (a word index taken as Python takes it) as a pointer, or NULL
 * with IndexError set.  `outside`: the index did not even fit a long long. */
static char *word_at(Py_buffer *view, __int128 index, int outside)
{
    Py_ssize_t count = view->len / 8;
    if (!outside && index < 0)
        index += count;
    if (outside || index < 0 || index >= count) {
        PyErr_SetString(PyExc_IndexError, "index out of bounds on dimension 1");
        return NULL;
    }
    return (char *)view->buf + 8 * (Py_ssize_t)index;
}

/* *word += amount, or `error` when the sum leaves the range of 8 bytes. */
static int add_to(char *word, __int128 amount, PyObject *error, const char *message)
{
    int64_t value;
    memcpy(&value, word, 8);
    __int128 sum = (__int128)value + amount;
    if (sum < INT64_MIN || sum > INT64_MAX) {
        PyErr_SetString(error, message);
        return -1;
    }
    value = (int64_t)sum;
    memcpy(word, &value, 8);
    return 0;
}

/* *word += amount as a memoryview of format 'q' does it. */
static int add_word(char *word, __int128 amount)
{
    return add_to(word, amount, PyExc_ValueError, "memoryview: invalid value for format 'q'");
}

/* *word += elapsed * n for an `elapsed` past the range of a long long, in Python's ints. */
static int add_product(char *word, PyObject *elapsed, Py_ssize_t n)
{
    int64_t value;
    memcpy(&value, word, 8);
    PyObject *old = PyLong_FromLongLong(value), *times = PyLong_FromSsize_t(n);
    PyObject *product = old && times ? PyNumber_Multiply(elapsed, times) : NULL;
    PyObject *sum = product ? PyNumber_Add(old, product) : NULL;
    Py_XDECREF(old);
    Py_XDECREF(times);
    Py_XDECREF(product);
    if (sum == NULL)
        return -1;
    int overflow;
    long long result;
    int converted = as_long_long(sum, &result, &overflow);
    Py_DECREF(sum);
    if (converted < 0)
        return -1;
    if (overflow) {
        PyErr_SetString(PyExc_ValueError, "memoryview: invalid value for format 'q'");
        return -1;
    }
    value = result;
    memcpy(word, &value, 8);
    return 0;
}

/* bisect_left(bounds, elapsed): the number of bounds below `elapsed`, by Python's comparison. */
static Py_ssize_t bucket_of(PyObject *bounds, PyObject *elapsed)
{
    Py_ssize_t low = 0, high = PyTuple_GET_SIZE(bounds);
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        int below = PyObject_RichCompareBool(PyTuple_GET_ITEM(bounds, middle), elapsed, Py_LT);
        if (below < 0)
            return -1;
        if (below)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

/* cells[listener], Python's way (a negative index counts from the end): a borrowed tuple of
 * three ints, or NULL with an exception set. */
static PyObject *listener_cells(PyObject *cells, PyObject *listener)
{
    long long index;
    int overflow;
    if (as_long_long(listener, &index, &overflow) < 0)
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(cells);
    if (!overflow && index < 0)
        index += count;
    if (overflow || index < 0 || index >= count) {
        PyErr_SetString(PyExc_IndexError, "tuple index out of range");
        return NULL;
    }
    PyObject *three = PyTuple_GET_ITEM(cells, (Py_ssize_t)index);
    if (!PyTuple_CheckExact(three) || PyTuple_GET_SIZE(three) != 3 ||
        !PyLong_Check(PyTuple_GET_ITEM(three, 0)) || !PyLong_Check(PyTuple_GET_ITEM(three, 1)) ||
        !PyLong_Check(PyTuple_GET_ITEM(three, 2))) {
        PyErr_SetString(PyExc_TypeError, "a listener's cells are a tuple of 3 ints");
        return NULL;
    }
    return three;
}

static PyObject *count_requests(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "count_requests(words, cells, bounds, listener, api_keys, elapsed_ns)");
        return NULL;
    }
    PyObject *bounds = args[2], *api_keys = args[4], *elapsed = args[5];
    if (!PyTuple_CheckExact(args[1]) || !PyTuple_CheckExact(bounds) || !PyLong_Check(args[3]) ||
        !PyList_CheckExact(api_keys) || !PyLong_Check(elapsed)) {
        PyErr_SetString(PyExc_TypeError, "cells and bounds are tuples, listener an int, "
                        "api_keys a list of ints, elapsed_ns an int");
        return NULL;
    }
    PyObject *cells = listener_cells(args[1], args[3]);
    if (cells == NULL)
        return NULL;
    long long base[3], elapsed_ns;
    int base_outside[3], elapsed_outside, overflow;
    for (int i = 0; i < 3; i++)
        if (as_long_long(PyTuple_GET_ITEM(cells, i), &base[i], &base_outside[i]) < 0)
            return NULL;
    if (as_long_long(elapsed, &elapsed_ns, &elapsed_outside) < 0)
        return NULL;
    /* Each API's number of requests in the read. */
    Py_ssize_t counts[API_KEYS] = {0};
    int lowest = API_KEYS, highest = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(api_keys); i++) {
        PyObject *item = PyList_GET_ITEM(api_keys, i);
        long long key;
        if (!PyLong_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "api_keys is a list of ints");
            return NULL;
        }
        if (as_long_long(item, &key, &overflow) < 0)
            return NULL;
        if (overflow || key < 0 || key >= API_KEYS)
            continue;
        counts[key]++;
        lowest = key < lowest ? (int)key : lowest;
        highest = key > highest ? (int)key : highest;
    }
    Py_ssize_t bucket = bucket_of(bounds, elapsed);
    if (bucket < 0)
        return NULL;
    if (highest < 0)  /* nothing to count */
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_ND) < 0)
        return NULL;
    if (view.ndim != 1 || view.itemsize != 8 || view.format == NULL ||
        strcmp(view.format, "q") != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "words is a writable 1-dimensional buffer of format 'q'");
        return NULL;
    }
    __int128 per_api = (__int128)PyTuple_GET_SIZE(bounds) + 1;
    int failed = 0;
    for (int key = lowest; key <= highest && !failed; key++) {
        Py_ssize_t n = counts[key];
        if (n == 0)
            continue;
        char *word;
        failed = (word = word_at(&view, (__int128)base[0] + key, base_outside[0])) == NULL ||
                 add_word(word, n) < 0 ||
                 (word = word_at(&view, (__int128)base[1] + key * per_api + bucket,
                                 base_outside[1])) == NULL ||
                 add_word(word, n) < 0 ||
                 (word = word_at(&view, (__int128)base[2] + key, base_outside[2])) == NULL ||
                 (elapsed_outside ? add_product(word, elapsed, n)
                                  : add_word(word, (__int128)elapsed_ns * n)) < 0;
    }
    PyBuffer_Release(&view);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* --- aggregate --------------------------------------------------------------------------- */

/* broker.shared.events.latency_bucket(us), capped at SKETCH_BUCKETS - 1. */
static Py_ssize_t latency_bucket(long long us)
{
    if (us < 8)
        return us < 0 ? 0 : (Py_ssize_t)us;
    int top = 63 - __builtin_clzll((unsigned long long)us);  /* 2**top <= us */
    long long bucket = 4LL * top + ((us - (1LL << top)) >> (top - 2));
    return bucket < SKETCH_BUCKETS - 1 ? (Py_ssize_t)bucket : SKETCH_BUCKETS - 1;
}

/* entry[index] += amount as an array of 8-byte integers does it: IndexError past its end,
 * OverflowError when the sum does not fit. */
static int add_at(Py_buffer *entry, Py_ssize_t index, __int128 amount)
{
    if (index >= entry->len / 8) {
        PyErr_SetString(PyExc_IndexError, "array index out of range");
        return -1;
    }
    return add_to((char *)entry->buf + 8 * index, amount, PyExc_OverflowError,
                  "signed integer is greater than maximum");
}

static PyObject *aggregate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "aggregate(entry, requests, bytes_in, bytes_out, us)");
        return NULL;
    }
    long long value[4];  /* requests, bytes_in, bytes_out, us */
    for (int i = 0; i < 4; i++) {
        int overflow;
        if (!PyLong_Check(args[i + 1])) {
            PyErr_SetString(PyExc_TypeError, "requests, bytes_in, bytes_out and us are ints");
            return NULL;
        }
        if (as_long_long(args[i + 1], &value[i], &overflow) < 0)
            return NULL;
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "a count past 8 bytes");
            return NULL;
        }
    }
    Py_buffer entry;
    if (PyObject_GetBuffer(args[0], &entry, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_ND) < 0)
        return NULL;
    int failed = entry.ndim != 1 || entry.itemsize != 8 || entry.format == NULL ||
                 strcmp(entry.format, "q") != 0;
    if (failed)
        PyErr_SetString(PyExc_TypeError, "entry is a writable array of format 'q'");
    failed = failed || add_at(&entry, 0, value[0]) < 0 || add_at(&entry, 1, value[1]) < 0 ||
             add_at(&entry, 2, value[2]) < 0 ||
             add_at(&entry, 3, (__int128)value[3] * value[0]) < 0 ||
             add_at(&entry, 4 + latency_bucket(value[3]), value[0]) < 0;
    PyBuffer_Release(&entry);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"count_requests", (PyCFunction)(void (*)(void))count_requests, METH_FASTCALL,
     "count_requests(words, cells, bounds, listener, api_keys, elapsed_ns) -> None"},
    {"aggregate", (PyCFunction)(void (*)(void))aggregate, METH_FASTCALL,
     "aggregate(entry, requests, bytes_in, bytes_out, us) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_counts",
    "A read's requests counted: the worker's counters, the event log's aggregate "
    "(see workers/counts.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__counts(void)
{
    PyObject *created = PyModule_Create(&module);
    if (created == NULL)
        return NULL;
    if (PyModule_AddIntConstant(created, "API_KEYS", API_KEYS) < 0 ||
        PyModule_AddIntConstant(created, "SKETCH_BUCKETS", SKETCH_BUCKETS) < 0) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
