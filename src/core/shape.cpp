#include "fusebox/core/shape.h"

#include <sstream>

#include "fusebox/core/error.h"

namespace fusebox {

int64_t numel(const Shape& s) {
  // Graph values are held to kMaxTensorBytes when they are made (core/memory.h), so this
  // cannot wrap for them; anything else that would is an error, never a wrapped count.
  int64_t n = 1;
  for (int64_t d : s) {
    FUSEBOX_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n), "shape", "the element count of ",
                  shape_str(s), d < 0 ? " (a negative extent)" : " overflows int64");
  }
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::channels_last ? "channels_last" : "contiguous";
}

std::vector<int> physical_order(size_t rank, MemoryFormat f) {
  std::vector<int> order(rank);
  for (size_t i = 0; i < rank; ++i) order[i] = int(i);
  if (f == MemoryFormat::channels_last && rank >= 3) {
    order.erase(order.begin() + 1);
    order.push_back(1);
  }
  return order;
}

Shape strides_for(const Shape& s, MemoryFormat f) {
  Shape st(s.size());
  int64_t acc = 1;
  const std::vector<int> order = physical_order(s.size(), f);
  for (size_t i = order.size(); i-- > 0;) {
    st[size_t(order[i])] = acc;
    acc *= s[size_t(order[i])];
  }
  return st;
}

bool is_dense_in(const Shape& s, const Shape& strides, MemoryFormat f) {
  if (strides.size() != s.size()) return false;
  int64_t expected = 1;
  const std::vector<int> order = physical_order(s.size(), f);
  for (size_t i = order.size(); i-- > 0;) {
    const size_t d = size_t(order[i]);
    if (s[d] != 1 && strides[d] != expected) return false;
    expected *= s[d];
  }
  return true;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::string position_str(int64_t i, const Shape& shape) {
  Shape coord(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coord[d] = shape[d] > 0 ? i % shape[d] : 0;
    i = shape[d] > 0 ? i / shape[d] : 0;
  }
  return shape_str(coord);
}

bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out) {
  size_t r = std::max(a.size(), b.size());
  Shape o(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da == db || db == 1)
      o[i] = da;
    else if (da == 1)
      o[i] = db;
    else
      return false;
  }
  *out = std::move(o);
  return true;
}

bool normalize_axis(int64_t axis, int64_t rank, int64_t* out) {
  if (axis < -rank || axis >= rank) return false;
  *out = axis < 0 ? axis + rank : axis;
  return true;
}

}  // namespace fusebox
