// The benchmarks' text tables: fixed-width columns, printed a row at a time so that each
// result shows as soon as it is measured (and survives a later case that fails).
#pragma once

#include <string>
#include <vector>

namespace fusebox::bench {

using Cells = std::vector<std::string>;

class Table {
 public:
  struct Column {
    std::string title;
    int width = 0;            // 0: as wide as the text (a last, free-form column)
    bool align_left = false;  // names; numbers align right
  };
  using Columns = std::vector<Column>;

  explicit Table(Columns columns) : columns_(std::move(columns)) {}

  void print_header() const;
  // One cell per column, in order; flushes stdout.
  void print_row(const Cells& cells) const;

 private:
  void print_line(const Cells& cells) const;

  Columns columns_;
};

// `value` with `decimals` digits after the point.
std::string fixed(double value, int decimals);

// `first` followed by `rest`: a table's own columns or cells and a shared group of them.
template <class T>
std::vector<T> joined(std::vector<T> first, const std::vector<T>& rest) {
  first.insert(first.end(), rest.begin(), rest.end());
  return first;
}

}  // namespace fusebox::bench
