/* Kineto (torch.profiler) trace scanning: the events of a "traceEvents" array, straight from
 * UTF-8 JSON text into column arrays, without building a Python object per event.
 *
 * The caller (collectors/torch_trace/scan.py) owns the file, the refillable buffer and the
 * top-level object; it calls cp_kineto_events() on the buffer positioned inside the array.
 * An event cut off by the end of the buffer is left for the next call (status MORE, pos at
 * the event's '{'), so chunk boundaries can fall anywhere.
 *
 * Kept: complete events (ph "X") with numeric ts and dur. Times are converted exactly from
 * the number's text: µs -> ns, rounded half away from zero below 1 ns, never through a double
 * (epoch µs with a fraction have more digits than a double holds).
 */
#include <stdint.h>
#include <string.h>

#include "counterprof_native.h"

#define OK 0
#define INCOMPLETE 1
#define FAIL (-1)
#define MAX_DEPTH 256

typedef struct {
    const unsigned char *b;
    int64_t n;
    int64_t i;
    const char *err;      /* what went wrong, for FAIL */
    int64_t err_pos;
} cur_t;

static int fail(cur_t *c, const char *what)
{
    c->err = what;
    c->err_pos = c->i;
    return FAIL;
}

static inline void skip_ws(cur_t *c)
{
    while (c->i < c->n) {
        unsigned char ch = c->b[c->i];
        if (ch != ' ' && ch != '\n' && ch != '\r' && ch != '\t')
            break;
        c->i++;
    }
}

/* ---- strings ------------------------------------------------------------------------ */

typedef struct {
    char *data;        /* NULL: only skip */
    int64_t len;
    int64_t cap;
    int overflow;
} sink_t;

static inline void put(sink_t *s, const char *p, int64_t k)
{
    if (!s || !s->data)
        return;
    if (s->len + k > s->cap) {
        s->overflow = 1;
        return;
    }
    memcpy(s->data + s->len, p, (size_t)k);
    s->len += k;
}

static void put_utf8(sink_t *s, uint32_t cp)
{
    char u[4];
    int k;
    if (cp < 0x80) { u[0] = (char)cp; k = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); k = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); k = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); k = 4;
    }
    put(s, u, k);
}

static int hex4(cur_t *c, uint32_t *out)
{
    if (c->i + 4 > c->n)
        return INCOMPLETE;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char h = c->b[c->i + k];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (uint32_t)(h - 'A' + 10);
        else return fail(c, "bad \\u escape");
    }
    c->i += 4;
    *out = v;
    return OK;
}

/* Length of a valid UTF-8 sequence starting at p (max n bytes), 0 when invalid, -1 when cut off. */
static int utf8_len(const unsigned char *p, int64_t n)
{
    unsigned char b0 = p[0];
    int k;
    uint32_t min;
    if (b0 < 0x80) return 1;
    if (b0 >= 0xC2 && b0 <= 0xDF) { k = 2; min = 0x80; }
    else if (b0 >= 0xE0 && b0 <= 0xEF) { k = 3; min = 0x800; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { k = 4; min = 0x10000; }
    else return 0;
    if (n < k) {
        for (int j = 1; j < n; j++)
            if ((p[j] & 0xC0) != 0x80) return 0;
        return -1;
    }
    uint32_t cp = b0 & (0x7F >> k);
    for (int j = 1; j < k; j++) {
        if ((p[j] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

/* A byte of v is '"', '\\' or >= 0x80 (8 bytes at a time: names run to kilobytes). */
static inline int special8(const unsigned char *p)
{
    uint64_t v, q, b;
    memcpy(&v, p, 8);
    q = v ^ 0x2222222222222222ULL;
    b = v ^ 0x5C5C5C5C5C5C5C5CULL;
    return ((((q - 0x0101010101010101ULL) & ~q) | ((b - 0x0101010101010101ULL) & ~b) | v)
            & 0x8080808080808080ULL) != 0;
}

/* c->i at the opening quote. Decodes into s (may be NULL). Invalid UTF-8 bytes and lone
 * surrogates become U+FFFD, so the output is always valid UTF-8. */
static int parse_string(cur_t *c, sink_t *s)
{
    c->i++;   /* opening quote */
    for (;;) {
        int64_t run = c->i;
        while (c->i + 8 <= c->n && !special8(c->b + c->i))
            c->i += 8;
        while (c->i < c->n) {
            unsigned char ch = c->b[c->i];
            if (ch == '"' || ch == '\\' || ch >= 0x80)
                break;
            c->i++;
        }
        put(s, (const char *)c->b + run, c->i - run);
        if (c->i >= c->n)
            return INCOMPLETE;
        unsigned char ch = c->b[c->i];
        if (ch == '"') {
            c->i++;
            return OK;
        }
        if (ch >= 0x80) {
            int k = utf8_len(c->b + c->i, c->n - c->i);
            if (k < 0)
                return INCOMPLETE;
            if (k == 0) {
                put_utf8(s, 0xFFFD);
                c->i++;
            } else {
                put(s, (const char *)c->b + c->i, k);
                c->i += k;
            }
            continue;
        }
        /* backslash */
        if (c->i + 1 >= c->n)
            return INCOMPLETE;
        unsigned char e = c->b[c->i + 1];
        c->i += 2;
        switch (e) {
        case '"': put(s, "\"", 1); break;
        case '\\': put(s, "\\", 1); break;
        case '/': put(s, "/", 1); break;
        case 'b': put(s, "\b", 1); break;
        case 'f': put(s, "\f", 1); break;
        case 'n': put(s, "\n", 1); break;
        case 'r': put(s, "\r", 1); break;
        case 't': put(s, "\t", 1); break;
        case 'u': {
            uint32_t cp;
            int r = hex4(c, &cp);
            if (r != OK)
                return r;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                /* a high surrogate: a low one must follow to make one code point */
                if (c->i + 2 > c->n)
                    return INCOMPLETE;
                if (c->b[c->i] == '\\' && c->b[c->i + 1] == 'u') {
                    int64_t save = c->i;
                    uint32_t lo;
                    c->i += 2;
                    r = hex4(c, &lo);
                    if (r != OK)
                        return r;
                    if (lo >= 0xDC00 && lo <= 0xDFFF) {
                        put_utf8(s, 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00));
                        break;
                    }
                    c->i = save;
                }
                put_utf8(s, 0xFFFD);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                put_utf8(s, 0xFFFD);
            } else {
                put_utf8(s, cp);
            }
            break;
        }
        default:
            c->i -= 1;
            return fail(c, "bad escape in a string");
        }
    }
}

/* An object's next key and its ':' (c->i before the key, whitespace allowed); decodes the key
 * into ks (may be NULL). */
static int parse_key(cur_t *c, sink_t *ks)
{
    int r;
    skip_ws(c);
    if (c->i >= c->n) return INCOMPLETE;
    if (c->b[c->i] != '"') return fail(c, "expected a key");
    if ((r = parse_string(c, ks)) != OK) return r;
    skip_ws(c);
    if (c->i >= c->n) return INCOMPLETE;
    if (c->b[c->i] != ':') return fail(c, "expected ':'");
    c->i++;
    return OK;
}

/* ---- numbers ------------------------------------------------------------------------ */

typedef struct {
    int64_t start, end;   /* the literal's text */
    int is_int;           /* no fraction, no exponent */
} num_t;

/* JSON number grammar; the literal must be followed by something (or eof) to be complete. */
static int scan_number(cur_t *c, int eof, num_t *num)
{
    int64_t i = c->i;
    num->start = i;
    num->is_int = 1;
    if (i < c->n && c->b[i] == '-') i++;
    if (i >= c->n) goto cut;
    if (c->b[i] == '0') {
        i++;
    } else if (c->b[i] >= '1' && c->b[i] <= '9') {
        while (i < c->n && c->b[i] >= '0' && c->b[i] <= '9') i++;
    } else {
        c->i = i;
        return fail(c, "bad number");
    }
    if (i < c->n && c->b[i] == '.') {
        num->is_int = 0;
        i++;
        int64_t d = i;
        while (i < c->n && c->b[i] >= '0' && c->b[i] <= '9') i++;
        if (i == d) { if (i >= c->n) goto cut; c->i = i; return fail(c, "bad number"); }
    }
    if (i < c->n && (c->b[i] == 'e' || c->b[i] == 'E')) {
        num->is_int = 0;
        i++;
        if (i < c->n && (c->b[i] == '+' || c->b[i] == '-')) i++;
        int64_t d = i;
        while (i < c->n && c->b[i] >= '0' && c->b[i] <= '9') i++;
        if (i == d) { if (i >= c->n) goto cut; c->i = i; return fail(c, "bad number"); }
    }
    if (i >= c->n && !eof)
        goto cut;    /* more digits may follow in the next chunk */
    c->i = i;
    num->end = i;
    return OK;
cut:
    if (eof) { c->i = i; return fail(c, "cut-off number"); }
    return INCOMPLETE;
}

/* An integer literal's value; 0 when it does not fit. */
static int number_int(const unsigned char *b, const num_t *num, int64_t *out)
{
    if (!num->is_int)
        return 0;
    int64_t i = num->start;
    int neg = 0;
    if (b[i] == '-') { neg = 1; i++; }
    uint64_t v = 0;
    for (; i < num->end; i++) {
        uint64_t d = (uint64_t)(b[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1) return 0;
        *out = (int64_t)(0 - v);
    } else {
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
    }
    return 1;
}

/* The literal (µs) times 1000, exactly, rounded half away from zero; 0 when out of range. */
static int number_times_1000(const unsigned char *b, const num_t *num, int64_t *out)
{
    char digits[64];
    int nd = 0, int_digits = 0, neg = 0;
    int64_t i = num->start, exp = 0;
    if (b[i] == '-') { neg = 1; i++; }
    for (; i < num->end && b[i] >= '0' && b[i] <= '9'; i++) {
        if (nd == 0 && b[i] == '0') { continue; }     /* leading zeros carry no value */
        if (nd >= 60) return 0;
        digits[nd++] = (char)b[i];
        int_digits++;
    }
    if (i < num->end && b[i] == '.') {
        for (i++; i < num->end && b[i] >= '0' && b[i] <= '9'; i++) {
            if (nd == 0 && b[i] == '0') { int_digits--; continue; }
            if (nd >= 60) break;          /* far below 1 ns: cannot change the rounding digit */
            digits[nd++] = (char)b[i];
        }
    }
    if (i < num->end && (b[i] == 'e' || b[i] == 'E')) {
        int eneg = 0;
        i++;
        if (b[i] == '+' || b[i] == '-') { eneg = b[i] == '-'; i++; }
        for (; i < num->end; i++) {
            if (exp > 100000) return 0;
            exp = exp * 10 + (b[i] - '0');
        }
        if (eneg) exp = -exp;
    }
    if (nd == 0) { *out = 0; return 1; }
    /* value = 0.d1d2...dn * 10^(int_digits + exp); ns keeps the first `keep` digits */
    int64_t keep = int_digits + exp + 3;
    if (keep > 19) return 0;
    uint64_t v = 0;
    for (int64_t k = 0; k < keep; k++) {
        uint64_t d = k < nd ? (uint64_t)(digits[k] - '0') : 0;
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (keep >= 0 && keep < nd && digits[keep] >= '5') v += 1;
    if (v > (uint64_t)INT64_MAX) return 0;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* ---- skipping any value -------------------------------------------------------------- */

static int literal(cur_t *c, const char *word)
{
    size_t k = strlen(word);
    for (size_t j = 0; j < k; j++) {
        if (c->i + (int64_t)j >= c->n)
            return INCOMPLETE;
        if (c->b[c->i + j] != (unsigned char)word[j])
            return fail(c, "unexpected character");
    }
    c->i += (int64_t)k;
    return OK;
}

static int skip_value(cur_t *c, int eof, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(c, "nested too deeply");
    skip_ws(c);
    if (c->i >= c->n)
        return INCOMPLETE;
    unsigned char ch = c->b[c->i];
    int r;
    switch (ch) {
    case '"':
        return parse_string(c, NULL);
    case '{':
    case '[': {
        unsigned char close = ch == '{' ? '}' : ']';
        c->i++;
        skip_ws(c);
        if (c->i >= c->n) return INCOMPLETE;
        if (c->b[c->i] == close) { c->i++; return OK; }
        for (;;) {
            if (ch == '{' && (r = parse_key(c, NULL)) != OK) return r;
            if ((r = skip_value(c, eof, depth + 1)) != OK) return r;
            skip_ws(c);
            if (c->i >= c->n) return INCOMPLETE;
            if (c->b[c->i] == ',') { c->i++; continue; }
            if (c->b[c->i] == close) { c->i++; return OK; }
            return fail(c, ch == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    case 't': return literal(c, "true");
    case 'f': return literal(c, "false");
    case 'n': return literal(c, "null");
    case 'N': return literal(c, "NaN");
    case 'I': return literal(c, "Infinity");
    default: {
        if (ch == '-' && c->i + 1 < c->n && c->b[c->i + 1] == 'I') {
            c->i++;
            return literal(c, "Infinity");
        }
        num_t num;
        return scan_number(c, eof, &num);
    }
    }
}

int cp_json_skip(const char *buf, int64_t len, int64_t pos, int eof, int64_t *end,
                 const char **error)
{
    cur_t c = {(const unsigned char *)buf, len, pos, NULL, 0};
    int r = skip_value(&c, eof, 0);
    if (r == OK) {
        *end = c.i;
    } else if (r == FAIL) {
        *end = c.err_pos;
        *error = c.err;
    } else if (eof) {
        *end = len;
        *error = "the text ends inside a value";
        r = FAIL;
    }
    return r;
}

/* ---- an op's recorded shapes, re-serialized from the args' own text -------------------- */

/* The importer keeps an op's "Input Dims", "Input type" and "Concrete Inputs" as
 * json.dumps({...}, separators=(",", ":")) of the decoded values. The text of ints, plain
 * ASCII strings, true/false/null and lists of those comes out of json.dumps unchanged but
 * for whitespace, so it is copied here without it; anything else (escapes, non-ASCII, floats,
 * objects, NaN, long ints) is left to Python (CP_SHAPES_PYTHON), so the result is the same. */
#define SHAPES_NONE 0
#define SHAPES_TEXT 1
#define SHAPES_PYTHON 2

/* The validated value at c->i into s; 0 when json.dumps would not give the same bytes.
 * *truthy: Python's truth of the value; *any: any() of a list's elements. */
static int canon_value(cur_t *c, sink_t *s, int depth, int *truthy, int *any)
{
    skip_ws(c);
    unsigned char ch = c->b[c->i];
    *any = 0;
    if (ch == '"') {
        int64_t a = c->i++;
        for (; c->b[c->i] != '"'; c->i++) {
            unsigned char x = c->b[c->i];
            if (x < 0x20 || x >= 0x7f || x == '\\') return 0;
        }
        c->i++;
        put(s, (const char *)c->b + a, c->i - a);
        *truthy = c->i - a > 2;
        return 1;
    }
    if (ch == '[') {
        if (depth > 64) return 0;
        c->i++;
        put(s, "[", 1);
        skip_ws(c);
        *truthy = c->b[c->i] != ']';
        while (c->b[c->i] != ']') {
            int t, a;
            if (!canon_value(c, s, depth + 1, &t, &a)) return 0;
            *any |= t;
            skip_ws(c);
            if (c->b[c->i] == ',') { c->i++; put(s, ",", 1); }
        }
        c->i++;
        put(s, "]", 1);
        return 1;
    }
    if (ch == 't') { c->i += 4; put(s, "true", 4); *truthy = 1; return 1; }
    if (ch == 'f') { c->i += 5; put(s, "false", 5); *truthy = 0; return 1; }
    if (ch == 'n') { c->i += 4; put(s, "null", 4); *truthy = 0; return 1; }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int64_t a = c->i;
        if (ch == '-') c->i++;
        int64_t d = c->i;
        while (c->b[c->i] >= '0' && c->b[c->i] <= '9') c->i++;
        unsigned char x = c->b[c->i];
        if (x == '.' || x == 'e' || x == 'E' || c->i - d > 18 || (ch == '-' && c->b[d] == '0'))
            return 0;          /* floats (repr's digits), long ints, -0 */
        put(s, (const char *)c->b + a, c->i - a);
        *truthy = !(c->i - a == 1 && ch == '0');
        return 1;
    }
    return 0;                  /* objects (repeated keys), NaN, Infinity */
}

/* Whether Python's json.loads (strict) takes the args text as the scanner did: no control
 * character inside a string, no integer past Python's digit limit. */
static int python_reads_args(const unsigned char *b, int64_t a0, int64_t a1)
{
    int in_str = 0;
    int64_t digits = 0;
    for (int64_t i = a0; i < a1; i++) {
        unsigned char x = b[i];
        if (in_str) {
            if (x == '\\') i++;
            else if (x == '"') in_str = 0;
            else if (x < 0x20) return 0;
        } else if (x == '"') {
            in_str = 1;
            digits = 0;
        } else if (x >= '0' && x <= '9') {
            if (++digits > 4000) return 0;
        } else {
            digits = 0;
        }
    }
    return 1;
}

/* vpos: where the values of "Input Dims", "Input type", "Concrete Inputs" start (-1: absent). */
static int make_shapes(const unsigned char *b, int64_t n, int64_t a0, int64_t a1,
                       const int64_t vpos[3], sink_t *s)
{
    int t, any;
    if (vpos[0] < 0)
        return SHAPES_NONE;
    if (!python_reads_args(b, a0, a1))
        return SHAPES_PYTHON;
    cur_t c = {b, n, vpos[0], NULL, 0};
    put(s, "{\"input_dims\":", 14);
    if (!canon_value(&c, s, 0, &t, &any)) return SHAPES_PYTHON;
    put(s, ",\"input_types\":", 15);
    if (vpos[1] < 0) {
        put(s, "null", 4);
    } else {
        c.i = vpos[1];
        if (!canon_value(&c, s, 0, &t, &any)) return SHAPES_PYTHON;
    }
    if (vpos[2] >= 0 && b[vpos[2]] == '[') {
        int64_t mark = s->len;
        put(s, ",\"concrete_inputs\":", 19);
        c.i = vpos[2];
        if (!canon_value(&c, s, 0, &t, &any)) return SHAPES_PYTHON;
        if (!any)
            s->len = mark;     /* recorded only when some input has a value */
    }
    put(s, "}", 1);
    return s->overflow ? SHAPES_PYTHON : SHAPES_TEXT;
}

/* ---- events ------------------------------------------------------------------------- */

static int key_is(const char *k, int64_t klen, const char *word)
{
    size_t n = strlen(word);
    return (size_t)klen == n && memcmp(k, word, n) == 0;
}

/* A number value into *out as an integer, or *ns (times 1000); leaves the sentinel when the
 * value is not a number of that kind. */
static int value_number(cur_t *c, int eof, int64_t *out, int times_1000)
{
    skip_ws(c);
    if (c->i >= c->n)
        return INCOMPLETE;
    unsigned char ch = c->b[c->i];
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        num_t num;
        int r = scan_number(c, eof, &num);
        if (r != OK)
            return r;
        int64_t v;
        if (times_1000 ? number_times_1000(c->b, &num, &v) : number_int(c->b, &num, &v))
            *out = v;
        return OK;
    }
    return skip_value(c, eof, 1);
}

static int parse_args(cur_t *c, int eof, struct cp_kineto_cols *cols, int row, int64_t vpos[3])
{
    int r;
    vpos[0] = vpos[1] = vpos[2] = -1;
    c->i++;   /* '{' */
    skip_ws(c);
    if (c->i >= c->n) return INCOMPLETE;
    if (c->b[c->i] == '}') { c->i++; return OK; }
    for (;;) {
        char key[32];
        sink_t ks = {key, 0, sizeof key, 0};
        if ((r = parse_key(c, &ks)) != OK) return r;
        int64_t *slot = NULL;
        if (!ks.overflow) {
            if (key_is(key, ks.len, "stream")) slot = &cols->stream[row];
            else if (key_is(key, ks.len, "device")) slot = &cols->device[row];
            else if (key_is(key, ks.len, "correlation")) slot = &cols->correlation[row];
            else if (key_is(key, ks.len, "External id")) slot = &cols->external_id[row];
            else if (key_is(key, ks.len, "bytes")) slot = &cols->bytes[row];
        }
        int shape = -1;
        if (!ks.overflow) {
            if (key_is(key, ks.len, "Input Dims")) shape = 0;
            else if (key_is(key, ks.len, "Input type")) shape = 1;
            else if (key_is(key, ks.len, "Concrete Inputs")) shape = 2;
        }
        if (shape >= 0) {
            skip_ws(c);
            vpos[shape] = c->i;    /* the last occurrence wins, as in Python */
        }
        if (slot) {
            *slot = CP_KINETO_NONE;    /* the last occurrence of a key wins, as in Python */
            r = value_number(c, eof, slot, 0);
        } else {
            r = skip_value(c, eof, 2);
        }
        if (r != OK) return r;
        skip_ws(c);
        if (c->i >= c->n) return INCOMPLETE;
        if (c->b[c->i] == ',') { c->i++; continue; }
        if (c->b[c->i] == '}') { c->i++; return OK; }
        return fail(c, "expected ',' or '}'");
    }
}

/* One event at c->i ('{'). *kept: 1 when it is a complete event with ts and dur. */
static int parse_event(cur_t *c, int eof, struct cp_kineto_cols *cols, int row, int *kept)
{
    int r;
    int64_t cat0 = cols->cat_off[row], name0 = cols->name_off[row];
    sink_t cat = {cols->cat_data, cat0, cols->cat_cap, 0};
    sink_t name = {cols->name_data, name0, cols->name_cap, 0};
    int have_cat = 0, have_name = 0, too_long = 0;
    unsigned char ph = 0;
    int shapes = SHAPES_NONE;
    sink_t sh = {cols->shapes_data, cols->shapes_off[row], cols->shapes_cap, 0};
    cols->ts_ns[row] = cols->dur_ns[row] = CP_KINETO_NONE;
    cols->pid[row] = cols->tid[row] = CP_KINETO_NONE;
    cols->stream[row] = cols->device[row] = cols->correlation[row] = CP_KINETO_NONE;
    cols->external_id[row] = cols->bytes[row] = CP_KINETO_NONE;
    cols->args_start[row] = cols->args_end[row] = -1;
    *kept = 0;

    c->i++;   /* '{' */
    skip_ws(c);
    if (c->i >= c->n) return INCOMPLETE;
    if (c->b[c->i] == '}') { c->i++; return OK; }
    for (;;) {
        char key[16];
        sink_t ks = {key, 0, sizeof key, 0};
        if ((r = parse_key(c, &ks)) != OK) return r;
        skip_ws(c);
        if (c->i >= c->n) return INCOMPLETE;
        unsigned char v0 = c->b[c->i];
        const char *k = ks.overflow ? "" : key;
        int64_t kl = ks.overflow ? 0 : ks.len;
        if (key_is(k, kl, "ph")) {
            ph = 0;
            if (v0 == '"') {
                char p[8];
                sink_t ps = {p, 0, sizeof p, 0};
                if ((r = parse_string(c, &ps)) != OK) return r;
                ph = ps.len > 0 ? (unsigned char)p[0] : 0;
            } else if ((r = skip_value(c, eof, 1)) != OK) return r;
        } else if (key_is(k, kl, "cat") || key_is(k, kl, "name")) {
            int is_cat = k[0] == 'c';
            sink_t *s = is_cat ? &cat : &name;
            s->len = is_cat ? cat0 : name0;    /* a repeated key replaces the earlier value */
            s->overflow = 0;
            if (v0 == '"') {
                if ((r = parse_string(c, s)) != OK) return r;
                /* with rows before it, the caller retries it on empty buffers; alone, it is
                 * longer than any buffer: that event is skipped (counted), the next ones read */
                if (s->overflow && row > 0) return fail(c, "a name longer than the output buffer");
                if (s->overflow) too_long = 1;
                if (is_cat) have_cat = 1; else have_name = 1;
            } else {
                if ((r = skip_value(c, eof, 1)) != OK) return r;
                if (is_cat) have_cat = 0; else have_name = 0;
            }
        } else if (key_is(k, kl, "ts")) {
            cols->ts_ns[row] = CP_KINETO_NONE;
            if ((r = value_number(c, eof, &cols->ts_ns[row], 1)) != OK) return r;
        } else if (key_is(k, kl, "dur")) {
            cols->dur_ns[row] = CP_KINETO_NONE;
            if ((r = value_number(c, eof, &cols->dur_ns[row], 1)) != OK) return r;
        } else if (key_is(k, kl, "pid")) {
            cols->pid[row] = CP_KINETO_NONE;
            if ((r = value_number(c, eof, &cols->pid[row], 0)) != OK) return r;
        } else if (key_is(k, kl, "tid")) {
            cols->tid[row] = CP_KINETO_NONE;
            if ((r = value_number(c, eof, &cols->tid[row], 0)) != OK) return r;
        } else if (key_is(k, kl, "args") && v0 == '{') {
            cols->stream[row] = cols->device[row] = cols->correlation[row] = CP_KINETO_NONE;
            cols->external_id[row] = cols->bytes[row] = CP_KINETO_NONE;
            int64_t a0 = c->i, vpos[3];
            if ((r = parse_args(c, eof, cols, row, vpos)) != OK) return r;
            cols->args_start[row] = a0;
            cols->args_end[row] = c->i;
            sh.len = cols->shapes_off[row];
            sh.overflow = 0;
            shapes = make_shapes(c->b, c->n, a0, c->i, vpos, &sh);
        } else {
            if (key_is(k, kl, "args")) {   /* args that are not an object: as if absent */
                cols->stream[row] = cols->device[row] = cols->correlation[row] = CP_KINETO_NONE;
                cols->external_id[row] = cols->bytes[row] = CP_KINETO_NONE;
                cols->args_start[row] = cols->args_end[row] = -1;
                shapes = SHAPES_NONE;
            }
            if ((r = skip_value(c, eof, 1)) != OK) return r;
        }
        skip_ws(c);
        if (c->i >= c->n) return INCOMPLETE;
        if (c->b[c->i] == ',') { c->i++; continue; }
        if (c->b[c->i] == '}') { c->i++; break; }
        return fail(c, "expected ',' or '}'");
    }
    if (too_long) {
        *kept = -1;
        return OK;
    }
    if (ph == 'X' && (cols->ts_ns[row] == CP_KINETO_NONE || cols->dur_ns[row] == CP_KINETO_NONE)) {
        *kept = -2;
        return OK;
    }
    if (ph != 'X')
        return OK;
    cols->ph[row] = ph;
    cols->cat_valid[row] = (uint8_t)have_cat;
    cols->name_valid[row] = (uint8_t)have_name;
    cols->cat_off[row + 1] = have_cat ? cat.len : cat0;
    cols->name_off[row + 1] = have_name ? name.len : name0;
    cols->shapes_state[row] = (uint8_t)shapes;
    cols->shapes_off[row + 1] = shapes == SHAPES_TEXT ? (int32_t)sh.len : cols->shapes_off[row];
    *kept = 1;
    return OK;
}

int cp_kineto_events(const char *buf, int64_t len, int eof, struct cp_kineto_cols *cols,
                     struct cp_kineto_scan *scan)
{
    cur_t c = {(const unsigned char *)buf, len, scan->pos, NULL, 0};
    scan->status = CP_KINETO_MORE;
    scan->error = NULL;
    for (;;) {
        int64_t event_start;
        skip_ws(&c);
        if (c.i >= c.n)
            break;
        unsigned char ch = c.b[c.i];
        if (scan->need_comma) {
            if (ch == ']') { c.i++; scan->status = CP_KINETO_END; break; }
            if (ch != ',') { fail(&c, "expected ',' or ']' between events"); goto failed; }
            c.i++;
            scan->need_comma = 0;
            continue;
        }
        if (ch == ']' && scan->rows_in_array == 0) { c.i++; scan->status = CP_KINETO_END; break; }
        if (cols->rows >= cols->capacity) { scan->status = CP_KINETO_FULL; break; }
        /* names may need the rest of the data buffers: stop while there is headroom */
        if (cols->name_cap - cols->name_off[cols->rows] < scan->min_headroom ||
            cols->cat_cap - cols->cat_off[cols->rows] < 4096 ||
            cols->shapes_cap - cols->shapes_off[cols->rows] < 65536) {
            if (cols->rows > 0) { scan->status = CP_KINETO_FULL; break; }
        }
        event_start = c.i;
        int r, kept = 0;
        if (ch == '{') {
            r = parse_event(&c, eof, cols, cols->rows, &kept);
        } else {
            r = skip_value(&c, eof, 1);    /* not an object: not an event */
        }
        if (r == INCOMPLETE) {
            c.i = event_start;
            if (eof) { fail(&c, "the file ends inside an event"); goto failed; }
            break;
        }
        if (r == FAIL) {
            if (c.err && strcmp(c.err, "a name longer than the output buffer") == 0 && cols->rows > 0) {
                c.i = event_start;      /* retry with empty buffers */
                scan->status = CP_KINETO_FULL;
                break;
            }
            goto failed;
        }
        scan->rows_in_array++;
        scan->need_comma = 1;
        if (kept == 1) {
            cols->rows++;
        } else {
            scan->skipped++;
            if (kept == -1) scan->too_long++;
            if (kept == -2) scan->bad_time++;
        }
    }
    scan->pos = c.i;
    return scan->status;
failed:
    scan->status = CP_KINETO_ERROR;
    scan->error = c.err;
    scan->error_pos = c.err_pos;
    scan->pos = c.i;
    return scan->status;
}
