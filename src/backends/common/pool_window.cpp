#include "backends/common/pool_window.h"

#include "fusebox/core/error.h"
#include "fusebox/ir/ops.h"

namespace fusebox {

PoolWindow make_pool_window(const PoolAttrs& attrs, const Shape& x, const Shape& y,
                            const std::string& where) {
  const int64_t rank = int64_t(x.size()) - 2;
  FUSEBOX_CHECK(rank >= 1 && rank <= 3 && y.size() == x.size() && y[0] == x[0] && y[1] == x[1],
                where, "input ", shape_str(x), " and output ", shape_str(y),
                " must be [N, C, D...] with 1 to 3 spatial dims");
  FUSEBOX_CHECK(int64_t(attrs.kernel.size()) == rank && int64_t(attrs.strides.size()) == rank &&
                    int64_t(attrs.dilations.size()) == rank &&
                    int64_t(attrs.pads_begin.size()) == rank &&
                    int64_t(attrs.pads_end.size()) == rank,
                where, "attributes are not normalised to ", rank, " spatial dims");
  PoolWindow w;
  w.batch = x[0];
  w.channels = x[1];
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t i = 3 - rank + d;  // after the leading extent-1 dims
    w.in[i] = x[2 + d];
    w.out[i] = y[2 + d];
    w.kernel[i] = attrs.kernel[d];
    w.stride[i] = attrs.strides[d];
    w.dilation[i] = attrs.dilations[d];
    w.pad_lo[i] = attrs.pads_begin[d];
    w.pad_hi[i] = attrs.pads_end[d];
    FUSEBOX_CHECK(w.kernel[i] >= 1 && w.stride[i] >= 1 && w.dilation[i] >= 1 && w.pad_lo[i] >= 0 &&
                      w.pad_hi[i] >= 0,
                  where, "bad window in spatial dim ", d, ": kernel ", w.kernel[i], ", stride ",
                  w.stride[i], ", dilation ", w.dilation[i], ", pads ", w.pad_lo[i], " and ",
                  w.pad_hi[i]);
  }
  return w;
}

}  // namespace fusebox
