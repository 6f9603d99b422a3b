/* Pool.metrics: the pool's statistics and ranks as Prometheus text (ferry_pool_metrics), with
 * the caller's labels given as a dict and rendered here: names checked, values escaped. */
#include <stdlib.h>
#include <string.h>

#include "ferry_py.h"

/* Labels every sample has already: a dict may not name them again. */
static const char *const taken_labels[] = {"pool", "backend", "rank", NULL};

/* A Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting "__", not one of ferry's).
 * 0, or -1 with ValueError. */
static int check_label_name(const char *name, Py_ssize_t len)
{
    int ok = len > 0 && !(name[0] >= '0' && name[0] <= '9') && strncmp(name, "__", 2) != 0;
    for (Py_ssize_t i = 0; ok && i < len; i++) {
        char c = name[i];
        ok = c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    }
    for (int i = 0; ok && taken_labels[i]; i++)
        ok = strcmp(name, taken_labels[i]) != 0;
    if (!ok)
        PyErr_Format(PyExc_ValueError,
                     "metrics label name \"%s\" is not allowed (expected [a-zA-Z_][a-zA-Z0-9_]*, "
                     "not starting with \"__\", not pool, backend or rank)",
                     name);
    return ok ? 0 : -1;
}

/* Appends name="value" to out (room for it reserved by the caller), escaping \, " and a
 * newline in the value. 0, or -1 with ValueError for a NUL. */
static int put_label(char **out, const char *name, Py_ssize_t name_len, const char *value,
                     Py_ssize_t value_len)
{
    char *p = *out;
    memcpy(p, name, (size_t)name_len);
    p += name_len;
    *p++ = '=';
    *p++ = '"';
    for (Py_ssize_t i = 0; i < value_len; i++) {
        char c = value[i];
        if (c == '\0') {
            PyErr_Format(PyExc_ValueError, "metrics label \"%s\" has a NUL character", name);
            return -1;
        }
        if (c == '\\' || c == '"' || c == '\n')
            *p++ = '\\';
        *p++ = c == '\n' ? 'n' : c;
    }
    *p++ = '"';
    *out = p;
    return 0;
}

/* The label text of a dict of labels (str names, values of any type, through str()): a
 * malloc'd string, NULL with an exception. */
static char *labels_text(PyObject *labels)
{
    if (!PyDict_Check(labels)) {
        PyErr_Format(PyExc_TypeError, "metrics labels must be a dict, not %.100s",
                     Py_TYPE(labels)->tp_name);
        return NULL;
    }
    PyObject *items = PyDict_Items(labels); /* str() below may run code that changes the dict */
    if (!items)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject **values = calloc((size_t)n + 1, sizeof(*values));
    char *text = NULL;
    size_t size = 1;
    if (!values) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0);
        Py_ssize_t key_len, value_len;
        if (!PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "metrics label names must be str, not %.100s",
                         Py_TYPE(key)->tp_name);
            goto done;
        }
        const char *name = PyUnicode_AsUTF8AndSize(key, &key_len);
        values[i] = PyObject_Str(PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1));
        if (!name || !values[i] || check_label_name(name, key_len) < 0 ||
            !PyUnicode_AsUTF8AndSize(values[i], &value_len))
            goto done;
        size += (size_t)key_len + 2 * (size_t)value_len + 4; /* ,name="value" escaped */
    }
    text = malloc(size);
    if (!text) {
        PyErr_NoMemory();
        goto done;
    }
    char *p = text;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t key_len, value_len;
        const char *name =
            PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0), &key_len);
        const char *value = PyUnicode_AsUTF8AndSize(values[i], &value_len);
        if (i)
            *p++ = ',';
        if (put_label(&p, name, key_len, value, value_len) < 0) {
            free(text);
            text = NULL;
            goto done;
        }
    }
    *p = '\0';
done:
    for (Py_ssize_t i = 0; values && i < n; i++)
        Py_XDECREF(values[i]);
    free(values);
    Py_DECREF(items);
    return text;
}

/* ferry_pool_metrics into a buffer grown to the size it asks for (the text may grow between
 * two calls: a rank attaches, a count gains a digit). */
static PyObject *render(fy_pool *self, const char *labels)
{
    size_t size = 16384, needed = 0;
    for (;;) {
        char *buf = malloc(size);
        if (!buf)
            return PyErr_NoMemory();
        ferry_status st;
        Py_BEGIN_ALLOW_THREADS st = ferry_pool_metrics(self->pool, labels, buf, size, &needed);
        Py_END_ALLOW_THREADS if (st != FERRY_OK)
        {
            free(buf);
            return fy_raise_pool(st, self->pool);
        }
        if (needed < size) {
            PyObject *text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)needed, "replace");
            free(buf);
            return text;
        }
        free(buf);
        size = needed + needed / 4 + 1024;
    }
}

PyObject *fy_pool_metrics(fy_pool *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"labels", NULL};
    PyObject *labels = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:metrics", keywords, &labels) ||
        fy_pool_check(self) < 0)
        return NULL;
    char *text = NULL;
    if (labels != Py_None && !(text = labels_text(labels)))
        return NULL;
    PyObject *result = render(self, text);
    free(text);
    return result;
}
