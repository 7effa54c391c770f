/* The frame splitter of a connection's read and the dispatch of memoized answers, in C
 * (workers/frames.py holds the same walk in Python, the oracle, used where this is not built).
 *
 * answer_memoized(data, offset, max_bytes, memo, out, handled[, end]) -> offset
 *
 * walks the complete request frames of `data` (bytes, or any buffer; only its first `end`
 * bytes when `end` is given, as if it were `data[:end]`) from `offset`, each a
 * 4-byte big-endian size and that many bytes, and answers those whose answer is memoized:
 * `memo` (a dict) maps a frame's key - its bytes without the size and without the correlation
 * id (api key, api version, then all after the correlation id) - to a tuple (head, tail,
 * api key): the answer is head + the request's correlation id + tail.  All answers of one call
 * join in one bytes object appended to `out` (nothing when none), and each answered request's
 * api key is appended to `handled`.  It stops at the first frame that is not answered so - fewer
 * than 4 bytes left, a size below 8 (no header), above `max_bytes` or above MAX_KEY_BYTES + 4
 * (no key that long is memoized), an incomplete frame, a key not in `memo` - or after
 * MAX_ANSWERS answers, and returns where it stopped: the offset of the first frame left for
 * the caller.  Every read is bounded by the length of `data`; what it allocates is one key at a
 * time (at most MAX_KEY_BYTES) and the answers.  A frame whose key is the previous answered
 * frame's (a pipeline repeats its request) gets the same answer without a lookup: the memo
 * cannot change during the walk (its keys are bytes: a lookup runs no Python code).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define MAX_KEY_BYTES 260  /* a memoized key: route (4 bytes) + at most 256 bytes after the id */
#define MAX_ANSWERS 256    /* per call: the hits are held on the stack until joined */

typedef struct {
    PyObject *value;       /* the memo's (head, tail, api key), a strong reference */
    Py_ssize_t correlation;  /* where the request's correlation id starts in `data` */
} Hit;

static int32_t read_size(const uint8_t *at)
{
    return (int32_t)((uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 |
                     (uint32_t)at[3]);
}

/* The memo's value for the frame at `frame` (its size prefix) of `size` bytes: a new reference,
 * or NULL with no exception set when the key is not memoized, or NULL with one set. */
static PyObject *memoized(PyObject *memo, const uint8_t *frame, Py_ssize_t size)
{
    PyObject *key = PyBytes_FromStringAndSize(NULL, size - 4);
    if (key == NULL)
        return NULL;
    char *bytes = PyBytes_AS_STRING(key);
    memcpy(bytes, frame + 4, 4);                       /* api key, api version */
    memcpy(bytes + 4, frame + 12, (size_t)(size - 8));  /* all after the correlation id */
    PyObject *value = PyDict_GetItemWithError(memo, key);  /* borrowed */
    Py_XINCREF(value);
    Py_DECREF(key);
    if (value == NULL || (PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 3 &&
                          PyBytes_Check(PyTuple_GET_ITEM(value, 0)) &&
                          PyBytes_Check(PyTuple_GET_ITEM(value, 1))))
        return value;
    Py_DECREF(value);
    PyErr_SetString(PyExc_TypeError, "a memoized answer is a tuple (head, tail, api key)");
    return NULL;
}

/* Whether the frames at `previous` and `frame` (their size prefixes), the second of `size`
 * bytes, have the same key: the same size, route and bytes after the correlation id. */
static int same_key(const uint8_t *previous, const uint8_t *frame, Py_ssize_t size)
{
    return read_size(previous) == size && memcmp(previous + 4, frame + 4, 4) == 0 &&
           memcmp(previous + 12, frame + 12, (size_t)(size - 8)) == 0;
}

/* One bytes object: head + correlation id + tail of every hit, in order; `total` its size. */
static PyObject *joined(const Hit *hits, Py_ssize_t count, Py_ssize_t total,
                        const uint8_t *data)
{
    PyObject *answers = PyBytes_FromStringAndSize(NULL, total);
    if (answers == NULL)
        return NULL;
    char *at = PyBytes_AS_STRING(answers);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *head = PyTuple_GET_ITEM(hits[i].value, 0);
        PyObject *tail = PyTuple_GET_ITEM(hits[i].value, 1);
        memcpy(at, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head));
        at += PyBytes_GET_SIZE(head);
        memcpy(at, data + hits[i].correlation, 4);
        at += 4;
        memcpy(at, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
        at += PyBytes_GET_SIZE(tail);
    }
    return answers;
}

/* A Python int as a long long, saturated at its ends (a huge max_bytes is "no limit"). */
static int saturated(PyObject *number, long long *value)
{
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (overflow)
        *value = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    return *value == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *answer_memoized(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "answer_memoized(data, offset, max_bytes, memo, out, handled[, end])");
        return NULL;
    }
    PyObject *memo = args[3], *out = args[4], *handled = args[5];
    long long offset, max_bytes, end = LLONG_MAX;
    if (saturated(args[1], &offset) < 0 || saturated(args[2], &max_bytes) < 0 ||
        (nargs == 7 && saturated(args[6], &end) < 0))
        return NULL;
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative offset");
        return NULL;
    }
    if (end < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative end");
        return NULL;
    }
    if (!PyDict_CheckExact(memo) || !PyList_Check(out) || !PyList_Check(handled)) {
        PyErr_SetString(PyExc_TypeError, "memo is a dict, out and handled are lists");
        return NULL;
    }
    Py_buffer view = {0};
    const uint8_t *data;
    Py_ssize_t length;
    if (PyBytes_CheckExact(args[0])) {  /* the hot path: what a read becomes */
        data = (const uint8_t *)PyBytes_AS_STRING(args[0]);
        length = PyBytes_GET_SIZE(args[0]);
    } else {  /* held until the end: a bytearray cannot be resized under the walk */
        if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
            return NULL;
        data = view.buf;
        length = view.len;
    }
    if (length > end)  /* the bytes past `end` are not the read's */
        length = (Py_ssize_t)end;
    Hit hits[MAX_ANSWERS];
    Py_ssize_t count = 0, total = 0;
    PyObject *result = NULL;
    if (offset > length) {  /* nothing to walk: the offset as it came */
        Py_INCREF(args[1]);
        result = args[1];
        goto done;
    }
    Py_ssize_t position = (Py_ssize_t)offset;
    while (count < MAX_ANSWERS && length - position >= 4) {
        int32_t size = read_size(data + position);
        if (size < 8 || size > max_bytes || size > MAX_KEY_BYTES + 4 ||
            length - position - 4 < size)
            break;
        PyObject *value;
        if (count && same_key(data + hits[count - 1].correlation - 8, data + position, size)) {
            value = hits[count - 1].value;  /* a pipeline repeats its request: no lookup */
            Py_INCREF(value);
        } else if ((value = memoized(memo, data + position, size)) == NULL) {
            if (PyErr_Occurred())
                goto done;
            break;
        }
        /* The answers' size, refused before it could wrap (memo values may be any bytes). */
        Py_ssize_t room = PY_SSIZE_T_MAX - total;
        Py_ssize_t head = PyBytes_GET_SIZE(PyTuple_GET_ITEM(value, 0));
        Py_ssize_t tail = PyBytes_GET_SIZE(PyTuple_GET_ITEM(value, 1));
        if (head > room || tail > room - head || 4 > room - head - tail) {
            Py_DECREF(value);
            PyErr_NoMemory();
            goto done;
        }
        total += head + 4 + tail;
        hits[count].value = value;
        hits[count].correlation = position + 8;
        count++;
        position += 4 + size;
    }
    if (count) {
        PyObject *answers = joined(hits, count, total, data);
        if (answers == NULL)
            goto done;
        int appended = PyList_Append(out, answers);
        Py_DECREF(answers);
        if (appended < 0)
            goto done;
        for (Py_ssize_t i = 0; i < count; i++)
            if (PyList_Append(handled, PyTuple_GET_ITEM(hits[i].value, 2)) < 0)
                goto done;
    }
    result = PyLong_FromSsize_t(position);
done:
    for (Py_ssize_t i = 0; i < count; i++)
        Py_DECREF(hits[i].value);
    if (view.obj != NULL)
        PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"answer_memoized", (PyCFunction)(void (*)(void))answer_memoized, METH_FASTCALL,
     "answer_memoized(data, offset, max_bytes, memo, out, handled[, end]) -> offset"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frames",
    "A read's request frames answered from the memo of pure answers (see workers/frames.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__frames(void)
{
    PyObject *created = PyModule_Create(&module);
    if (created == NULL)
        return NULL;
    if (PyModule_AddIntConstant(created, "MAX_KEY_BYTES", MAX_KEY_BYTES) < 0 ||
        PyModule_AddIntConstant(created, "MAX_ANSWERS", MAX_ANSWERS) < 0) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
