//! Compiled fast path of changelake's pgoutput row decoder.
//!
//! One job: turn a pgoutput Insert/Update/Delete message (protocol version 1, or 2 inside a stream
//! block; text-format values) of a relation whose columns are all scalars into the JSON texts
//! bronze stores (`record`, `record_pk`, `old_record`, `old_record_pk`) and the unchanged-TOAST
//! column names. It mirrors `ingest/sources/postgres/pgoutput.py` + `changes.py` + `values.py`
//! byte for byte (a property test compares the two on random rows); anything it does not handle
//! exactly the same way (an array column, a malformed message, a value that does not map) is
//! refused with a ValueError, and the Python decoder then decodes that message and names the
//! problem.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Column value mappings (docs/bronze.md), the codes `ingest/sources/postgres/native.py` passes.
const KIND_INT: u8 = 0; // the text as it is: a JSON number
const KIND_FLOAT: u8 = 1; // a JSON number; NaN and +-Infinity as JSON strings
const KIND_BOOL: u8 = 2; // 't' / 'f' -> true / false
const KIND_STRING: u8 = 3; // the text as a JSON string (json.encoder.encode_basestring)

const MSG_INSERT: u8 = b'I';
const MSG_UPDATE: u8 = b'U';
const MSG_DELETE: u8 = b'D';
const TUPLE_NEW: u8 = b'N';
const TUPLE_KEY: u8 = b'K';
const TUPLE_OLD: u8 = b'O';
const COL_NULL: u8 = b'n';
const COL_UNCHANGED: u8 = b'u';
const COL_TEXT: u8 = b't';
const COL_BINARY: u8 = b'b';

/// Action codes returned to Python (index into its Action table).
const ACTION_INSERT: u8 = 0;
const ACTION_UPDATE: u8 = 1;
const ACTION_DELETE: u8 = 2;

enum Value<'a> {
    Null,
    Unchanged,
    Data(&'a [u8]),
}

type Refusal = &'static str;

fn read_i16(buf: &[u8], pos: usize) -> Result<i16, Refusal> {
    let b = buf.get(pos..pos + 2).ok_or("truncated")?;
    Ok(i16::from_be_bytes([b[0], b[1]]))
}

fn read_i32(buf: &[u8], pos: usize) -> Result<i32, Refusal> {
    let b = buf.get(pos..pos + 4).ok_or("truncated")?;
    Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// TupleData at `pos`: the values and the offset after them.
fn parse_tuple(buf: &[u8], mut pos: usize) -> Result<(Vec<Value<'_>>, usize), Refusal> {
    let count = read_i16(buf, pos)?;
    if count < 0 {
        return Err("negative column count");
    }
    pos += 2;
    let mut values = Vec::with_capacity(count as usize);
    for _ in 0..count {
        match *buf.get(pos).ok_or("truncated")? {
            COL_TEXT | COL_BINARY => {
                let len = read_i32(buf, pos + 1)?;
                if len < 0 {
                    return Err("negative value length");
                }
                let start = pos + 5;
                pos = start + len as usize;
                values.push(Value::Data(buf.get(start..pos).ok_or("truncated")?));
            }
            COL_NULL => {
                pos += 1;
                values.push(Value::Null);
            }
            COL_UNCHANGED => {
                pos += 1;
                values.push(Value::Unchanged);
            }
            _ => return Err("unknown column marker"),
        }
    }
    Ok((values, pos))
}

/// json.encoder.encode_basestring (ensure_ascii=False): the same escapes, lowercase hex.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let v = c as u32;
                out.push_str("\\u00");
                out.push(HEX[(v >> 4) as usize] as char);
                out.push(HEX[(v & 0xf) as usize] as char);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn ascii(value: &[u8]) -> Result<&str, Refusal> {
    if !value.is_ascii() {
        return Err("not ASCII");
    }
    std::str::from_utf8(value).map_err(|_| "not ASCII")
}

fn push_value(out: &mut String, kind: u8, value: &[u8]) -> Result<(), Refusal> {
    match kind {
        KIND_INT => out.push_str(ascii(value)?),
        KIND_FLOAT => match ascii(value)? {
            "NaN" => out.push_str("\"NaN\""),
            "Infinity" => out.push_str("\"Infinity\""),
            "-Infinity" => out.push_str("\"-Infinity\""),
            text => out.push_str(text),
        },
        KIND_BOOL => match value {
            b"t" => out.push_str("true"),
            b"f" => out.push_str("false"),
            _ => return Err("boolean neither t nor f"),
        },
        KIND_STRING => push_json_string(out, std::str::from_utf8(value).map_err(|_| "not UTF-8")?),
        _ => return Err("unknown kind"),
    }
    Ok(())
}

/// One field of a COPY text-format row, backslash escapes resolved (COPY's rules: \b \f \n \r \t \v,
/// 1-3 octal digits, x and 1-2 hex digits, any other character stands for itself). `\N` is NULL.
fn copy_field(field: &[u8]) -> Result<Option<std::borrow::Cow<'_, [u8]>>, Refusal> {
    if field == b"\\N" {
        return Ok(None);
    }
    if !field.contains(&b'\\') {
        return Ok(Some(std::borrow::Cow::Borrowed(field)));
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let c = field[i];
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let e = *field.get(i + 1).ok_or("backslash at the end of a field")?;
        i += 2;
        match e {
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'0'..=b'7' => {
                let mut v: u32 = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + (field[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push((v & 0xff) as u8);
            }
            b'x' if i < field.len() && field[i].is_ascii_hexdigit() => {
                let mut v: u32 = 0;
                let mut n = 0;
                while n < 2 && i < field.len() && field[i].is_ascii_hexdigit() {
                    v = v * 16 + (field[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    Ok(Some(std::borrow::Cow::Owned(out)))
}

type Field<'a> = Option<std::borrow::Cow<'a, [u8]>>;

/// The lines of a buffer of whole COPY text-format lines.
fn copy_lines(buf: &[u8]) -> Result<impl Iterator<Item = &[u8]>, Refusal> {
    let body = buf.strip_suffix(b"\n").ok_or("a COPY buffer ends with a newline")?;
    Ok(body.split(|&b| b == b'\n'))
}

/// A COPY text-format line's fields, escapes resolved (`copy_field`).
fn copy_fields(line: &[u8]) -> Result<Vec<Field<'_>>, Refusal> {
    line.split(|&b| b == b'\t').map(copy_field).collect()
}

fn values_of<'a>(fields: &'a [Field<'_>]) -> Vec<Value<'a>> {
    fields
        .iter()
        .map(|f| match f {
            None => Value::Null,
            Some(v) => Value::Data(v.as_ref()),
        })
        .collect()
}

/// A key column's text as a page's `key_text` holds it: the field as UTF-8, NULL as "".
fn key_field<'a>(field: &'a Field<'_>) -> Result<&'a str, Refusal> {
    match field {
        None => Ok(""),
        Some(v) => std::str::from_utf8(v.as_ref()).map_err(|_| "key not UTF-8"),
    }
}

/// Append `len` to an Arrow offsets buffer (int32, little-endian); a column past 2 GiB is refused.
fn push_offset(offsets: &mut Vec<u8>, len: usize) -> Result<(), Refusal> {
    let at = i32::try_from(len).map_err(|_| "a page column over 2 GiB")?;
    offsets.extend_from_slice(&at.to_le_bytes());
    Ok(())
}

const OFFSET_BYTES: usize = 4; // an Arrow string column's int32 offset

/// libpq's `int PQgetCopyData(PGconn *conn, char **buffer, int async)`.
type GetCopyData = unsafe extern "C" fn(*mut c_void, *mut *mut c_char, c_int) -> c_int;
/// libpq's `void PQfreemem(void *ptr)`.
type FreeMem = unsafe extern "C" fn(*mut c_void);

const COPY_MORE: i32 = 0; // `read_copy` handed back refused lines; the COPY goes on
const COPY_END: i32 = -1; // PQgetCopyData: the COPY is done (its result follows)
const COPY_FAILED: i32 = -2; // PQgetCopyData: an error (PQerrorMessage)

/// `PageBuilder.read_copy`'s (status, cut, refused lines, panic message).
type ReadCopyResult<'py> = (i32, bool, Option<Bound<'py, PyBytes>>, Option<String>);

/// What `PageBuilder::read_copy_lines` read up to its return.
struct CopyRead {
    status: i32,
    cut: bool,
    refused: Vec<u8>,
    panic: Option<String>,
}

/// A caught panic's message (a panic payload is a &str or a String when it came from `panic!`).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// How much of a PageBuilder holds whole rows: what `restore` goes back to.
#[derive(Clone, Copy, Default)]
struct Kept {
    count: usize,
    chars: u64,
    record_pk: usize,
    record: usize,
    key_text: usize,
}

/// A snapshot page's rows as Arrow string columns (int32 offsets + UTF-8 data), filled a COPY buffer
/// at a time by `RowEncoder.copy_into` (or `push_rows`, the rows Python encoded for a buffer the
/// compiled encoder refused) and handed to Python whole by `buffers`: no Python object per row.
///
/// Every filling call first drops what a refused or panicked call left half written (`restore`),
/// so the page only ever holds the rows of the calls that succeeded.
#[pyclass]
struct PageBuilder {
    key_width: usize,
    count: usize,
    chars: u64, // the record JSON's length in characters (Python's len), the page budget's measure
    record_pk: String,
    record_pk_offsets: Vec<u8>,
    record: String,
    record_offsets: Vec<u8>,
    key_text: String,
    key_offsets: Vec<u8>,
    kept: Kept,
    encoder: Py<RowEncoder>, // the relation whose rows `read_copy` encodes
}

impl PageBuilder {
    fn new(key_width: usize, encoder: Py<RowEncoder>) -> Self {
        let zero = 0i32.to_le_bytes().to_vec();
        PageBuilder {
            key_width,
            count: 0,
            chars: 0,
            record_pk: String::new(),
            record_pk_offsets: zero.clone(),
            record: String::new(),
            record_offsets: zero.clone(),
            key_text: String::new(),
            key_offsets: zero,
            kept: Kept::default(),
            encoder,
        }
    }

    /// Close a row whose record_pk, record and key texts were appended: their end offsets.
    fn end_row(&mut self, width: u64) -> Result<(), Refusal> {
        push_offset(&mut self.record_pk_offsets, self.record_pk.len())?;
        push_offset(&mut self.record_offsets, self.record.len())?;
        self.count += 1;
        self.chars += width;
        Ok(())
    }

    fn keep(&mut self) {
        self.kept = Kept {
            count: self.count,
            chars: self.chars,
            record_pk: self.record_pk.len(),
            record: self.record.len(),
            key_text: self.key_text.len(),
        };
    }

    /// Back to the rows kept by the last call that succeeded.
    fn restore(&mut self) {
        let k = self.kept;
        self.count = k.count;
        self.chars = k.chars;
        self.record_pk.truncate(k.record_pk);
        self.record.truncate(k.record);
        self.key_text.truncate(k.key_text);
        self.record_pk_offsets.truncate((k.count + 1) * OFFSET_BYTES);
        self.record_offsets.truncate((k.count + 1) * OFFSET_BYTES);
        self.key_offsets.truncate((k.count * self.key_width + 1) * OFFSET_BYTES);
    }

    /// Read a COPY ... TO STDOUT (text format) from libpq, one CopyData message at a time, encoding
    /// its lines onto the page (`RowEncoder::copy_into_page`) until the stream ends, fails, or a
    /// message is refused. After the page's budget cut it (`cut`) the stream's later lines are
    /// read and dropped. A refused message (or one whose encoding panicked) and the lines after
    /// it, up to `chunk_rows` messages or `chunk_bytes` bytes, are handed back raw with the page
    /// as it was before that message: the caller encodes them in Python and calls again.
    ///
    /// Safety: `conn` is a live PGconn in the COPY OUT state, and `functions` are PQgetCopyData
    /// and PQfreemem of the libpq that made it; nothing else uses the connection meanwhile.
    unsafe fn read_copy_lines(
        &mut self,
        encoder: &RowEncoder,
        conn: *mut c_void,
        functions: (GetCopyData, FreeMem),
        max_chars: u64,
        mut cut: bool,
        chunk: (usize, usize),
    ) -> CopyRead {
        let (get_copy_data, freemem) = functions;
        let (chunk_rows, chunk_bytes) = chunk;
        let mut refused = Vec::new();
        let mut refused_rows = 0usize;
        let mut panic = None;
        loop {
            let mut buf: *mut c_char = std::ptr::null_mut();
            let n = get_copy_data(conn, &mut buf, 0);
            if n < 0 {
                if !buf.is_null() {
                    freemem(buf.cast());
                }
                let status = if n == COPY_END { COPY_END } else { COPY_FAILED };
                return CopyRead { status, cut, refused, panic };
            }
            let message: &[u8] = if buf.is_null() { &[] } else { std::slice::from_raw_parts(buf.cast::<u8>(), n as usize) };
            if refused_rows > 0 {
                refused.extend_from_slice(message);
                refused_rows += 1;
            } else if !cut && !message.is_empty() {
                let page = &mut *self;
                match catch_unwind(AssertUnwindSafe(|| encoder.copy_into_page(page, message, max_chars))) {
                    Ok(Ok(ended)) => cut = ended,
                    Ok(Err(_)) => {
                        self.restore();
                        refused.extend_from_slice(message);
                        refused_rows = 1;
                    }
                    Err(payload) => {
                        self.restore();
                        panic = Some(panic_text(payload.as_ref()));
                        refused.extend_from_slice(message);
                        refused_rows = 1;
                    }
                }
            }
            if !buf.is_null() {
                freemem(buf.cast());
            }
            if refused_rows > 0 && (refused_rows >= chunk_rows || refused.len() >= chunk_bytes) {
                return CopyRead { status: COPY_MORE, cut, refused, panic };
            }
        }
    }
}

#[pymethods]
impl PageBuilder {
    /// Rows kept so far.
    fn __len__(&self) -> usize {
        self.kept.count
    }

    /// Read the rows of the COPY ... TO STDOUT (text format) that libpq connection `conn` is
    /// receiving onto this page, without the GIL, with libpq's `PQgetCopyData` and `PQfreemem` at
    /// the addresses `get_copy_data` and `freemem` (of the very libpq that made `conn`: a PGconn
    /// is opaque). Rows stop being kept at the one that would take the page's record JSON past
    /// `max_chars` characters (`cut`, as `copy_into`); the stream's later lines are then read and
    /// dropped. `cut`: the page was already cut.
    ///
    /// Returns (status, cut, refused, panic). status -1: the COPY ended (the caller reads its
    /// result); -2: libpq failed to read it (PQerrorMessage says why); 0: `refused` holds whole
    /// lines the compiled encoder refused (or panicked on: `panic` says how) starting at the
    /// first such line, at most `chunk_rows` messages or `chunk_bytes` bytes, which the caller
    /// encodes and appends before calling again. With -1 or -2, `refused` may hold lines too.
    /// Addresses of 0 are refused with ValueError; any other wrong address is undefined behaviour.
    #[allow(clippy::too_many_arguments)]
    fn read_copy<'py>(
        &mut self,
        py: Python<'py>,
        conn: usize,
        get_copy_data: usize,
        freemem: usize,
        max_chars: u64,
        cut: bool,
        chunk_rows: usize,
        chunk_bytes: usize,
    ) -> PyResult<ReadCopyResult<'py>> {
        if conn == 0 || get_copy_data == 0 || freemem == 0 {
            return Err(PyValueError::new_err("read_copy needs a connection and libpq's functions"));
        }
        // SAFETY: the caller passes libpq's PQgetCopyData and PQfreemem (non-null, checked above).
        let functions = unsafe {
            (std::mem::transmute::<usize, GetCopyData>(get_copy_data), std::mem::transmute::<usize, FreeMem>(freemem))
        };
        let encoder = self.encoder.clone_ref(py);
        let encoder = encoder.get();
        self.restore();
        let chunk = (chunk_rows.max(1), chunk_bytes.max(1));
        // SAFETY: `conn` is the live PGconn in COPY OUT the caller owns; it waits for this call.
        let read = py.detach(|| unsafe {
            self.read_copy_lines(encoder, conn as *mut c_void, functions, max_chars, cut, chunk)
        });
        let refused = (!read.refused.is_empty()).then(|| PyBytes::new(py, &read.refused));
        Ok((read.status, read.cut, refused, read.panic))
    }

    /// Append rows encoded in Python, (record_pk, record, key texts) each, with `copy_into`'s page
    /// budget: stops before the row that would take the record JSON past `max_chars` characters
    /// (the page's first row is kept). Whether that row ended the page.
    fn push_rows(&mut self, rows: Vec<(String, String, Vec<String>)>, max_chars: u64) -> PyResult<bool> {
        self.restore();
        for (record_pk, record, key) in rows {
            if key.len() != self.key_width {
                return Err(PyValueError::new_err("a row's key has another width than the page's"));
            }
            let width = record.chars().count() as u64;
            if self.count > 0 && self.chars + width > max_chars {
                self.keep();
                return Ok(true);
            }
            self.record_pk.push_str(&record_pk);
            self.record.push_str(&record);
            for k in &key {
                self.key_text.push_str(k);
                push_offset(&mut self.key_offsets, self.key_text.len()).map_err(PyValueError::new_err)?;
            }
            self.end_row(width).map_err(PyValueError::new_err)?;
        }
        self.keep();
        Ok(false)
    }

    /// The page as Arrow buffers: (rows, record JSON characters, record_pk offsets, record_pk data,
    /// record offsets, record data, key_text list offsets, key_text string offsets, key_text data,
    /// the last row's key texts (empty without rows)). Offsets are int32 little-endian.
    #[allow(clippy::type_complexity)]
    fn buffers<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(
        usize,
        u64,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Vec<String>,
    )> {
        self.restore();
        let mut lists = Vec::with_capacity((self.count + 1) * OFFSET_BYTES);
        for row in 0..=self.count {
            push_offset(&mut lists, row * self.key_width).map_err(PyValueError::new_err)?;
        }
        let mut last_key = Vec::new();
        if self.count > 0 {
            let offset = |i: usize| {
                let b = &self.key_offsets[i * OFFSET_BYTES..(i + 1) * OFFSET_BYTES];
                i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            };
            let first = (self.count - 1) * self.key_width;
            for i in first..first + self.key_width {
                last_key.push(self.key_text[offset(i)..offset(i + 1)].to_owned());
            }
        }
        Ok((
            self.count,
            self.chars,
            PyBytes::new(py, &self.record_pk_offsets),
            PyBytes::new(py, self.record_pk.as_bytes()),
            PyBytes::new(py, &self.record_offsets),
            PyBytes::new(py, self.record.as_bytes()),
            PyBytes::new(py, &lists),
            PyBytes::new(py, &self.key_offsets),
            PyBytes::new(py, self.key_text.as_bytes()),
            last_key,
        ))
    }
}

/// A change message of a protocol 2 stream block as (its xid, the message as protocol 1 sends it):
/// `pgoutput.unstream`.
fn unstream(payload: &[u8]) -> Result<(u32, Vec<u8>), Refusal> {
    let kind = *payload.first().ok_or("empty")?;
    let xid = payload.get(1..5).ok_or("truncated")?;
    let mut message = Vec::with_capacity(payload.len() - 4);
    message.push(kind);
    message.extend_from_slice(&payload[5..]);
    Ok((u32::from_be_bytes([xid[0], xid[1], xid[2], xid[3]]), message))
}

/// One relation's columns, as the Python ChangeBuilder's `_Rel` holds them for `encode_record`.
#[pyclass(frozen)]
struct RowEncoder {
    kinds: Vec<u8>,
    keys: Vec<String>, // '"col":' prefixes
    names: Vec<String>,
    pk_idx: Vec<usize>,
}

impl RowEncoder {
    /// `values.encode_record`: the row as a JSON object, unchanged-TOAST columns left out and listed. A tuple
    /// whose width is not the relation's is refused (Python raises: a Relation message was missed).
    fn record(&self, values: &[Value<'_>]) -> Result<(String, Option<Vec<String>>), Refusal> {
        let mut out = String::with_capacity(64 + 16 * values.len());
        let toast = self.record_into(values, &mut out)?;
        Ok((out, toast))
    }

    /// `record`, appended to `out` (a page's record column); on a refusal `out` may hold part of it.
    fn record_into(&self, values: &[Value<'_>], out: &mut String) -> Result<Option<Vec<String>>, Refusal> {
        if values.len() != self.kinds.len() {
            return Err("tuple width differs from the relation's");
        }
        let mut toast: Option<Vec<String>> = None;
        out.push('{');
        let mut first = true;
        for (i, v) in values.iter().enumerate() {
            match v {
                Value::Unchanged => toast.get_or_insert_with(Vec::new).push(self.names[i].clone()),
                Value::Null | Value::Data(_) => {
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    out.push_str(&self.keys[i]);
                    match v {
                        Value::Data(d) => push_value(out, self.kinds[i], d)?,
                        _ => out.push_str("null"),
                    }
                }
            }
        }
        out.push('}');
        Ok(toast)
    }

    /// `values.encode_key`: the key columns as a JSON object, a NULL one as null. An unchanged-TOAST
    /// key column takes its value from `old` (an Update's `K`/`O` tuple: the new value is the old
    /// one); with no old tuple, or NULL there (not sent), it is refused (Python raises: the key
    /// cannot be known). `record` is not affected: it leaves the column out and lists it.
    fn pk(&self, values: &[Value<'_>], old: Option<&[Value<'_>]>) -> Result<String, Refusal> {
        let mut out = String::with_capacity(32);
        self.pk_into(values, old, &mut out)?;
        Ok(out)
    }

    /// `pk`, appended to `out` (a page's record_pk column); on a refusal `out` may hold part of it.
    fn pk_into(&self, values: &[Value<'_>], old: Option<&[Value<'_>]>, out: &mut String) -> Result<(), Refusal> {
        out.push('{');
        for (n, &i) in self.pk_idx.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            out.push_str(&self.keys[i]);
            match values.get(i).ok_or("key column missing from the tuple")? {
                Value::Data(d) => push_value(out, self.kinds[i], d)?,
                Value::Null => out.push_str("null"),
                Value::Unchanged => match old.filter(|o| o.len() == self.kinds.len()).map(|o| &o[i]) {
                    Some(Value::Data(d)) => push_value(out, self.kinds[i], d)?,
                    _ => return Err("unchanged TOAST key column without an old value"),
                },
            }
        }
        out.push('}');
        Ok(())
    }

    /// The rows of a COPY ... TO STDOUT text-format buffer (whole lines) as (record_pk, record).
    fn copy_rows(&self, buf: &[u8]) -> Result<Vec<(String, String)>, Refusal> {
        Ok(self.copy_page(buf)?.into_iter().map(|(pk, record, _)| (pk, record)).collect())
    }

    /// The rows of a COPY text-format buffer as (record_pk, record, key columns as text) (a snapshot page's keyset cursor, `key_text`):
    /// the unescaped field as UTF-8, a NULL key column as "" (what the Python page reader stores).
    #[allow(clippy::type_complexity)]
    fn copy_page(&self, buf: &[u8]) -> Result<Vec<(String, String, Vec<String>)>, Refusal> {
        let mut rows = Vec::new();
        for line in copy_lines(buf)? {
            let fields = copy_fields(line)?;
            let values = values_of(&fields);
            let (record, _) = self.record(&values)?;
            let key = self.pk_idx.iter().map(|&i| key_field(&fields[i]).map(str::to_owned)).collect::<Result<_, _>>()?;
            rows.push((self.pk(&values, None)?, record, key));
        }
        Ok(rows)
    }

    /// Append the rows of a COPY text-format buffer to `page`, as `copy_page` encodes them, until the
    /// row that would take the page's record JSON past `max_chars` characters (a page's first row
    /// is kept whatever its width). Whether that row ended the page (the rest of `buf` is not read).
    /// On a refusal `page` keeps only the rows it had (`PageBuilder::restore`).
    fn copy_into_page(&self, page: &mut PageBuilder, buf: &[u8], max_chars: u64) -> Result<bool, Refusal> {
        page.restore();
        if page.key_width != self.pk_idx.len() {
            return Err("the page was made for another relation's key");
        }
        for line in copy_lines(buf)? {
            let fields = copy_fields(line)?;
            let values = values_of(&fields);
            let start = page.record.len();
            self.record_into(&values, &mut page.record)?;
            let width = page.record[start..].chars().count() as u64;
            if page.count > 0 && page.chars + width > max_chars {
                page.record.truncate(start);
                page.keep();
                return Ok(true);
            }
            self.pk_into(&values, None, &mut page.record_pk)?;
            for &i in &self.pk_idx {
                page.key_text.push_str(key_field(&fields[i])?);
                push_offset(&mut page.key_offsets, page.key_text.len())?;
            }
            page.end_row(width)?;
        }
        page.keep();
        Ok(false)
    }

    #[allow(clippy::type_complexity)]
    fn decode(
        &self,
        buf: &[u8],
    ) -> Result<(u8, Option<String>, String, Option<String>, Option<String>, Option<Vec<String>>), Refusal> {
        let msg = *buf.first().ok_or("empty")?;
        let mut kind = *buf.get(5).ok_or("truncated")?;
        let mut pos = 6;
        let out = match msg {
            MSG_INSERT => {
                if kind != TUPLE_NEW {
                    return Err("insert without a new tuple");
                }
                let (new, end) = parse_tuple(buf, pos)?;
                pos = end;
                let (record, toast) = self.record(&new)?;
                (ACTION_INSERT, Some(record), self.pk(&new, None)?, None, None, toast)
            }
            MSG_UPDATE => {
                let mut old = None;
                if kind == TUPLE_KEY || kind == TUPLE_OLD {
                    let (values, end) = parse_tuple(buf, pos)?;
                    old = Some(values);
                    kind = *buf.get(end).ok_or("truncated")?;
                    pos = end + 1;
                }
                if kind != TUPLE_NEW {
                    return Err("update without a new tuple");
                }
                let (new, end) = parse_tuple(buf, pos)?;
                pos = end;
                let (record, toast) = self.record(&new)?;
                let pk = self.pk(&new, old.as_deref())?;
                let (mut old_record, mut old_pk) = (None, None);
                if let Some(old) = old {
                    old_record = Some(self.record(&old)?.0);
                    let opk = self.pk(&old, None)?;
                    if opk != pk {
                        old_pk = Some(opk);
                    }
                }
                (ACTION_UPDATE, Some(record), pk, old_record, old_pk, toast)
            }
            MSG_DELETE => {
                if kind != TUPLE_KEY && kind != TUPLE_OLD {
                    return Err("delete without an old tuple");
                }
                let (old, end) = parse_tuple(buf, pos)?;
                pos = end;
                let (old_record, _) = self.record(&old)?;
                (ACTION_DELETE, None, self.pk(&old, None)?, Some(old_record), None, None)
            }
            _ => return Err("not a row message"),
        };
        if pos != buf.len() {
            return Err("trailing bytes");
        }
        Ok(out)
    }
}

#[pymethods]
impl RowEncoder {
    #[new]
    fn new(kinds: Vec<u8>, keys: Vec<String>, names: Vec<String>, pk_idx: Vec<usize>) -> PyResult<Self> {
        if keys.len() != kinds.len() || names.len() != kinds.len() {
            return Err(PyValueError::new_err("kinds, keys and names must have one entry per column"));
        }
        if kinds.iter().any(|&k| k > KIND_STRING) {
            return Err(PyValueError::new_err("unknown column kind"));
        }
        if pk_idx.iter().any(|&i| i >= kinds.len()) {
            return Err(PyValueError::new_err("key column index out of range"));
        }
        Ok(RowEncoder { kinds, keys, names, pk_idx })
    }

    /// Decode one Insert/Update/Delete payload of this relation.
    ///
    /// Returns (action code 0 insert / 1 update / 2 delete, record, record_pk, old_record,
    /// old_record_pk, unchanged_toast names); raises ValueError when the Python decoder must
    /// take the message (it raises the error a user sees, if there is one).
    #[allow(clippy::type_complexity)]
    fn change(
        &self,
        payload: &[u8],
    ) -> PyResult<(u8, Option<String>, String, Option<String>, Option<String>, Option<Vec<String>>)> {
        self.decode(payload).map_err(PyValueError::new_err)
    }

    /// Decode one Insert/Update/Delete sent inside a stream block of protocol 2 (the (sub)transaction's
    /// xid after the type byte): (xid, then what `change` returns for the message without it).
    #[allow(clippy::type_complexity)]
    fn change_streamed(
        &self,
        payload: &[u8],
    ) -> PyResult<(u32, u8, Option<String>, String, Option<String>, Option<String>, Option<Vec<String>>)> {
        let (xid, message) = unstream(payload).map_err(PyValueError::new_err)?;
        let (code, record, pk, old_record, old_pk, toast) = self.decode(&message).map_err(PyValueError::new_err)?;
        Ok((xid, code, record, pk, old_record, old_pk, toast))
    }

    /// The rows of a buffer of whole COPY ... TO STDOUT text-format lines, as (record_pk, record).
    ///
    /// Raises ValueError when the Python path must take the buffer (a value that does not map, a
    /// row whose width is not the relation's); it raises the error a user sees, if there is one.
    fn copy_rows_of(&self, buf: &[u8]) -> PyResult<Vec<(String, String)>> {
        self.copy_rows(buf).map_err(PyValueError::new_err)
    }

    /// The rows of a buffer of whole COPY ... TO STDOUT text-format lines as a snapshot page holds
    /// them: (record_pk, record, key columns as text). Raises ValueError as `copy_rows_of` does.
    #[allow(clippy::type_complexity)]
    fn copy_page_of(&self, buf: &[u8]) -> PyResult<Vec<(String, String, Vec<String>)>> {
        self.copy_page(buf).map_err(PyValueError::new_err)
    }

    /// An empty snapshot page of this relation's rows, for `copy_into` and its own `read_copy`.
    fn page(slf: &Bound<'_, Self>) -> PageBuilder {
        PageBuilder::new(slf.get().pk_idx.len(), slf.clone().unbind())
    }

    /// Append the rows of a buffer of whole COPY ... TO STDOUT text-format lines to `page`, until the
    /// row that would take its record JSON past `max_chars` characters; whether that row ended the
    /// page. Encoded without the GIL. Raises ValueError as `copy_rows_of` does, `page` then holding
    /// only the rows it had.
    fn copy_into(&self, py: Python<'_>, mut page: PyRefMut<'_, PageBuilder>, buf: &[u8], max_chars: u64) -> PyResult<bool> {
        let page = &mut *page;
        py.detach(|| self.copy_into_page(page, buf, max_chars)).map_err(PyValueError::new_err)
    }
}

#[pymodule]
fn changelake_pgoutput(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RowEncoder>()?;
    m.add_class::<PageBuilder>()?;
    Ok(())
}
