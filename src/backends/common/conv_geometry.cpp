#include "backends/common/conv_geometry.h"

#include "fusebox/core/error.h"

namespace fusebox {

ConvGeometry make_conv_geometry(const ConvAttrs& attrs, const Shape& x, const Shape& w,
                                const Shape& y, const std::string& where) {
  const int64_t rank = int64_t(w.size()) - 2;
  FUSEBOX_CHECK(rank >= 1 && rank <= 3, where, "weight ", shape_str(w),
                ": expected 1 to 3 spatial dims");
  FUSEBOX_CHECK(int64_t(x.size()) == rank + 2 && int64_t(y.size()) == rank + 2, where, "input ",
                shape_str(x), ", weight ", shape_str(w), " and output ", shape_str(y),
                " must have the same rank");
  FUSEBOX_CHECK(int64_t(attrs.strides.size()) == rank && int64_t(attrs.dilations.size()) == rank &&
                    int64_t(attrs.pads_begin.size()) == rank &&
                    int64_t(attrs.pads_end.size()) == rank,
                where, "attributes are not normalised to ", rank, " spatial dims");
  ConvGeometry g;
  g.spatial_rank = int(rank);
  g.batch = x[0];
  g.in_channels = x[1];
  g.out_channels = w[0];
  g.groups = attrs.groups;
  FUSEBOX_CHECK(g.groups >= 1 && g.in_channels % g.groups == 0 && g.out_channels % g.groups == 0 &&
                    w[1] * g.groups == g.in_channels,
                where, "channels do not match groups=", g.groups, ": input ", shape_str(x),
                ", weight ", shape_str(w));
  FUSEBOX_CHECK(y[0] == g.batch && y[1] == g.out_channels, where, "output ", shape_str(y),
                " does not match input ", shape_str(x), " and weight ", shape_str(w));
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t i = 3 - rank + d;  // after the leading extent-1 dims
    g.in[i] = x[2 + d];
    g.out[i] = y[2 + d];
    g.filter[i] = w[2 + d];
    g.stride[i] = attrs.strides[d];
    g.dilation[i] = attrs.dilations[d];
    g.pad_lo[i] = attrs.pads_begin[d];
    g.pad_hi[i] = attrs.pads_end[d];
    FUSEBOX_CHECK(g.stride[i] >= 1 && g.dilation[i] >= 1 && g.filter[i] >= 1 && g.in[i] >= 1 &&
                      g.out[i] >= 1 && g.pad_lo[i] >= 0 && g.pad_hi[i] >= 0,
                  where, "bad spatial dim ", d, ": input ", shape_str(x), ", weight ", shape_str(w),
                  ", output ", shape_str(y), ", stride ", g.stride[i], ", dilation ", g.dilation[i],
                  ", pads ", g.pad_lo[i], "/", g.pad_hi[i]);
    const int64_t full = conv_output_extent(g.in[i], g.filter[i], g.stride[i], g.dilation[i],
                                            g.pad_lo[i], g.pad_hi[i]);
    FUSEBOX_CHECK(g.out[i] == full, where, "spatial dim ", d, ": output extent ", g.out[i],
                  " does not match input extent ", g.in[i], " (a convolution of it gives ", full,
                  ")");
  }
  return g;
}

}  // namespace fusebox
