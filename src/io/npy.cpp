// numpy .npy files (numpy's format.py documents the layout):
//
//   "\x93NUMPY" major minor  header_len  header  data
//
// header_len is a little-endian u16 in version 1.0 and a u32 in 2.0 / 3.0 (3.0 only changes
// the header's text encoding to UTF-8). The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n' so that the data starts at a multiple of 64 bytes.
// The data is the array's elements in C (row-major) or Fortran (column-major) order.
//
// Reading parses that dict with a small recursive-descent parser (not an evaluator): exactly
// the three keys, string / bool / tuple-of-int values, whitespace and a trailing comma
// tolerated; anything else is an error that quotes the header.
#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "fusebox/core/memory.h"
#include "fusebox/io/tensor_file.h"
#include "io/bytes.h"

namespace fusebox {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;
// No legitimate header comes near this; it bounds what an error message quotes and what
// a corrupt length field can make us scan.
constexpr size_t kMaxHeaderLen = 1 << 20;

struct NpyHeader {
  DType dtype = DType::f32;
  bool u8 = false;  // '|u1' bytes, widened to dtype i32 on reading (the IR has no u8)
  bool big_endian = false;
  bool fortran_order = false;
  Shape shape;
};

// Parses the header dict. Every error quotes the header (control bytes escaped).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{', "the header to start with '{'");
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string("a key");
      skip_space();
      expect(':', cat("':' after '", key, "'"));
      skip_space();
      if (key == "descr") {
        check_once(&have_descr, key);
        parse_descr(&h);
      } else if (key == "fortran_order") {
        check_once(&have_order, key);
        h.fortran_order = parse_bool(key);
      } else if (key == "shape") {
        check_once(&have_shape, key);
        h.shape = parse_shape();
      } else {
        fail(cat("unexpected key '", key,
                 "' (a .npy header has exactly 'descr', 'fortran_order' and 'shape')"));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}' after a value");
      }
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the closing '}'");
    if (!have_descr) fail("missing 'descr'");
    if (!have_order) fail("missing 'fortran_order'");
    if (!have_shape) fail("missing 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    std::string quoted;
    for (char c : text_.substr(0, 200)) {
      if (c == '\n')
        quoted += "\\n";
      else if (c >= 0x20 && c < 0x7f)
        quoted += c;
      else
        quoted += cat("\\x", "0123456789abcdef"[(c >> 4) & 15], "0123456789abcdef"[c & 15]);
    }
    if (text_.size() > 200) quoted += "...";
    throw Error(where_, cat("bad header: ", message, " at offset ", pos_, " in \"", quoted, "\""));
  }
  char peek() const {
    if (pos_ >= text_.size()) fail("header ends early");
    return text_[pos_];
  }
  void expect(char c, const std::string& what) {
    if (peek() != c) fail("expected " + what);
    ++pos_;
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  void check_once(bool* seen, const std::string& key) {
    if (*seen) fail(cat("duplicate key '", key, "'"));
    *seen = true;
  }

  // A quoted string without escapes (numpy never writes any).
  std::string parse_string(const char* what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail(cat("expected ", what, " as a quoted string"));
    const size_t start = ++pos_;
    while (peek() != quote) {
      if (text_[pos_] == '\\') fail("escapes in strings are not supported");
      ++pos_;
    }
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool parse_bool(const std::string& key) {
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const size_t n = std::strlen(word);
      if (text_.substr(pos_, n) == word) {
        pos_ += n;
        return value;
      }
    }
    fail(cat("expected True or False for '", key, "'"));
  }

  // A Python tuple of non-negative integers: "()", "(3,)", "(2, 3)", "(2, 3,)". Python 2
  // files may write longs ("3L").
  Shape parse_shape() {
    expect('(', "a tuple for 'shape'");
    Shape shape;
    bool trailing_comma = false;
    skip_space();
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9') fail("expected a non-negative integer in 'shape'");
      int64_t v = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (v > (INT64_MAX - 9) / 10) fail("extent too large in 'shape'");
        v = v * 10 + (text_[pos_++] - '0');
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
      shape.push_back(v);
      skip_space();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        skip_space();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in 'shape'");
      }
    }
    ++pos_;  // ')'
    // "(3)" is the integer 3 in Python, not a tuple.
    if (shape.size() == 1 && !trailing_comma) fail("'shape' (n) needs a trailing comma: (n,)");
    return shape;
  }

  // "<f4": byte order ('<' little, '>' big, '=' native, '|' not applicable), kind, size.
  void parse_descr(NpyHeader* h) {
    if (pos_ < text_.size() && text_[pos_] == '[') {
      fail("structured dtypes ('descr' as a list) are not supported");
    }
    const std::string descr = parse_string("'descr'");
    static const struct {
      const char* code;
      DType dtype;
    } kTypes[] = {{"f8", DType::f64}, {"f4", DType::f32}, {"f2", DType::f16},
                  {"i8", DType::i64}, {"i4", DType::i32}, {"b1", DType::boolean}};
    if (descr.size() >= 2) {
      const char order = descr[0];
      const std::string code = descr.substr(1);
      if (code == "u1" && (order == '|' || order == '<' || order == '>' || order == '=')) {
        h->dtype = DType::i32;  // image bytes: every value fits
        h->u8 = true;
        return;
      }
      for (const auto& t : kTypes) {
        if (code != t.code) continue;
        const bool one_byte = dtype_size(t.dtype) == 1;
        if (order == '<' || order == '=' || order == '>' || (order == '|' && one_byte)) {
          h->dtype = t.dtype;
          h->big_endian = order == '>' && !one_byte;
          return;
        }
      }
    }
    throw Error(where_,
                cat("unsupported dtype '", descr,
                    "' (supported: f8 f4 f2 i8 i4 b1, little- or big-endian; u1, read as i32)"));
  }

  std::string_view text_;
  const std::string& where_;
  size_t pos_ = 0;
};

// Copies a column-major array into row-major order. Walks the source sequentially,
// advancing a multi-index first-axis-fastest and tracking the row-major destination offset.
void fortran_to_row_major(const unsigned char* src, unsigned char* dst, const Shape& shape,
                          size_t elem_size, int64_t numel) {
  const size_t rank = shape.size();
  const Shape strides = contiguous_strides(shape);
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < numel; ++i) {
    std::memcpy(dst + size_t(offset) * elem_size, src + size_t(i) * elem_size, elem_size);
    for (size_t axis = 0; axis < rank; ++axis) {
      offset += strides[axis];
      if (++index[axis] < shape[axis]) break;
      offset -= strides[axis] * shape[axis];
      index[axis] = 0;
    }
  }
}

std::string shape_tuple(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? ", " : "", shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& where) {
  const io::ByteReader in(bytes, where);
  FUSEBOX_CHECK(bytes.size() >= kMagicLen + 4 && std::memcmp(bytes.data(), kMagic, kMagicLen) == 0,
                where, "not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  FUSEBOX_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, where,
                "unsupported .npy format version ", major, ".", minor,
                " (supported: 1.0, 2.0, 3.0)");
  const size_t prefix_len = major == 1 ? kMagicLen + 4 : kMagicLen + 6;
  const uint64_t header_len = major == 1 ? in.u16(8, "header length") : in.u32(8, "header length");
  FUSEBOX_CHECK(header_len <= kMaxHeaderLen, where, "header length ", header_len,
                " is implausibly large");
  const std::string_view header = in.bytes(prefix_len, header_len, "header");
  const NpyHeader h = HeaderParser(header, where).parse();

  const size_t elem_size = h.u8 ? 1 : dtype_size(h.dtype);
  const uint64_t data_offset = prefix_len + header_len;
  const uint64_t available = bytes.size() - data_offset;
  const std::optional<TensorSize> size = checked_tensor_size(h.shape, elem_size);
  FUSEBOX_CHECK(size, where, "shape ", shape_str(h.shape), " of ", dtype_name(h.dtype),
                " is impossibly large (more than ", format_bytes(kMaxTensorBytes), ")");
  const uint64_t expected = size->bytes;
  FUSEBOX_CHECK(expected == available, where, "expected ", expected, " bytes of data (shape ",
                shape_str(h.shape), " of ", dtype_name(h.dtype), "), file has ", available);

  Tensor t = Tensor::empty(h.dtype, h.shape);
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data() + data_offset);
  if (h.u8) {  // row-major bytes first, then each widened
    std::vector<unsigned char> rows(size_t(t.numel()));
    if (h.fortran_order && t.rank() > 1)
      fortran_to_row_major(src, rows.data(), h.shape, 1, t.numel());
    else if (expected > 0)
      std::memcpy(rows.data(), src, expected);
    std::copy(rows.begin(), rows.end(), t.data<int32_t>());
    return t;
  }
  auto* dst = static_cast<unsigned char*>(t.raw());
  if (h.fortran_order && t.rank() > 1) {
    fortran_to_row_major(src, dst, h.shape, elem_size, t.numel());
  } else if (expected > 0) {
    std::memcpy(dst, src, expected);
  }
  if (h.big_endian) io::byteswap_elements(dst, size_t(t.numel()), elem_size);
  if (h.dtype == DType::boolean) {
    // A C++ bool must hold 0 or 1; numpy treats any nonzero byte as True.
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = dst[i] != 0;
  }
  return t;
}

std::string serialize_npy(const Tensor& t) {
  FUSEBOX_CHECK(t.defined(), "npy", "cannot serialize an undefined tensor");
  // numpy has no bfloat16: bf16 tensors are written as '<f4', a lossless widening, and
  // read back as f32.
  if (t.dtype() == DType::bf16) return serialize_npy(t.cast(DType::f32));
  const char* descr = "";
  switch (t.dtype()) {
    case DType::f64:
      descr = "<f8";
      break;
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f16:
      descr = "<f2";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::boolean:
      descr = "|b1";
      break;
    case DType::bf16:
      break;
  }
  const std::string dict = cat(
      "{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape_tuple(t.shape()), ", }");
  // As numpy does: pad with spaces so that prefix + header (ending in '\n') is a multiple of
  // 64 bytes; version 2.0 (a u32 length) only when the header does not fit a u16.
  int major = 1;
  size_t prefix_len = kMagicLen + 4;
  size_t header_len = dict.size() + 1 + (kAlign - (prefix_len + dict.size() + 1) % kAlign);
  if (header_len > 0xffff) {
    major = 2;
    prefix_len = kMagicLen + 6;
    header_len = dict.size() + 1 + (kAlign - (prefix_len + dict.size() + 1) % kAlign);
  }
  std::string out(kMagic, kMagicLen);
  out += char(major);
  out += char(0);
  if (major == 1)
    io::put_u16(&out, uint16_t(header_len));
  else
    io::put_u32(&out, uint32_t(header_len));
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

Tensor read_npy(const std::string& path) {
  return parse_npy(read_file(path), "npy: " + path);
}

void write_npy(const std::string& path, const Tensor& t) {
  write_file_atomic(path, serialize_npy(t));
}

}  // namespace fusebox
