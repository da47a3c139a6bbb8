#include "table.h"

#include <cstdio>

#include "fusebox/core/error.h"

namespace fusebox::bench {

void Table::print_header() const {
  Cells titles;
  for (const Column& c : columns_) titles.push_back(c.title);
  print_line(titles);
}

void Table::print_row(const Cells& cells) const {
  FUSEBOX_CHECK(cells.size() == columns_.size(), "bench table", cells.size(), " cells for ",
                columns_.size(), " columns");
  print_line(cells);
  std::fflush(stdout);
}

void Table::print_line(const Cells& cells) const {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    const Column& c = columns_[i];
    const size_t pad = cells[i].size() < size_t(c.width) ? size_t(c.width) - cells[i].size() : 0;
    if (i) line += ' ';
    if (!c.align_left) line.append(pad, ' ');
    line += cells[i];
    // Left-aligned cells are padded too, except at the end of the line.
    if (c.align_left && i + 1 < cells.size()) line.append(pad, ' ');
  }
  std::printf("%s\n", line.c_str());
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

}  // namespace fusebox::bench
