// Data sets: CSV and IDX loaders, the built-in sets, splits and standardisation.
#include <push/data/dataset.h>

#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include "core/seed.h"
#include "core/user_text.h"

namespace push::data {
namespace fs = std::filesystem;
namespace {

struct Table {
  std::string source;  // the file, for error messages
  std::vector<std::string> names;
  std::vector<std::vector<double>> rows;
  std::vector<int64_t> lines;  // the file's line number of each row
};

std::string trim(std::string s) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

std::vector<std::string> cells_of(const std::string& line, char sep) {
  std::vector<std::string> cells;
  if (sep == ' ') {
    std::istringstream ss(line);
    std::string c;
    while (ss >> c) cells.push_back(c);
  } else {
    std::stringstream ss(line);
    std::string c;
    while (std::getline(ss, c, sep)) cells.push_back(trim(c));
    if (!line.empty() && line.back() == sep) cells.push_back("");
  }
  return cells;
}

using push::detail::printable;

/// The longest line a table may have: a file without newlines (a binary, /dev/zero) is
/// refused after this many bytes, not read whole into one line.
constexpr size_t kMaxLine = size_t{1} << 20;

/// std::getline, bounded: false at the end of the file, push::Error past kMaxLine bytes.
bool read_line(std::istream& in, std::string& line, const fs::path& path, int64_t lineno, const char* origin) {
  line.clear();
  std::streambuf& buffer = *in.rdbuf();
  for (int c = buffer.sbumpc(); c != std::char_traits<char>::eof(); c = buffer.sbumpc()) {
    if (c == '\n') return true;
    if (c == '\r') {  // CRLF, or a CR alone (old Mac files)
      if (buffer.sgetc() == '\n') buffer.sbumpc();
      return true;
    }
    PUSH_CHECK(line.size() < kMaxLine, origin, path.string(), " line ", lineno, " is longer than ", kMaxLine,
               " bytes: is it a CSV file?");
    // No text holds a NUL byte: a program, an archive or an image given as data.
    PUSH_CHECK(c != 0, origin, path.string(), " line ", lineno,
               " holds a NUL byte: it is a binary file, not a CSV text file");
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

/// Reads a numeric table: `skip` lines, then a header row (if `header`), then rows.
Table read_table(const fs::path& path, char sep, int skip, bool header, const char* origin) {
  PUSH_CHECK(fs::exists(path), origin, "cannot open '", path.string(), "': no such file");
  PUSH_CHECK(!fs::is_directory(path), origin, "'", path.string(), "' is a directory, not a CSV file");
  // A FIFO or a device could be read once, or never end: data are read from a file.
  PUSH_CHECK(fs::is_regular_file(path), origin, "'", path.string(),
             "' is not a regular file (a FIFO, a socket or a device?): give a CSV file");
  std::ifstream in(path);
  PUSH_CHECK(in, origin, "cannot open '", path.string(), "'");
  Table t;
  t.source = path.string();
  std::string line;
  int64_t lineno = 0;
  // A UTF-8 byte order mark (spreadsheets write one) is not part of the first cell.
  if (in.rdbuf()->sgetc() == 0xEF) {
    char bom[3] = {};
    if (in.rdbuf()->sgetn(bom, 3) != 3 || std::string(bom, 3) != "\xEF\xBB\xBF") {
      in.seekg(0);
    }
  }
  while (lineno < skip && read_line(in, line, path, lineno + 1, origin)) ++lineno;
  if (header) {
    PUSH_CHECK(read_line(in, line, path, lineno + 1, origin), origin, "'", path.string(),
               "' is empty (expected a header row)");
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    t.names = cells_of(line, sep);
    std::set<std::string> seen;
    for (const auto& name : t.names) {
      PUSH_CHECK(seen.insert(name).second, origin, path.string(), " has two columns named '", printable(name),
                 "' in its header: name each column once");
    }
  }
  while (read_line(in, line, path, lineno + 1, origin)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty()) continue;
    auto cells = cells_of(line, sep);
    if (t.names.empty()) {
      for (size_t i = 0; i < cells.size(); ++i) t.names.push_back("column" + std::to_string(i));
    }
    PUSH_CHECK(cells.size() == t.names.size(), origin, path.string(), " line ", lineno, " has ", cells.size(),
               " cells, the header has ", t.names.size());
    std::vector<double> row(cells.size());
    for (size_t i = 0; i < cells.size(); ++i) {
      const std::string& c = cells[i];
      const auto v = push::detail::parse_decimal(c);
      std::string word = c;
      std::transform(word.begin(), word.end(), word.begin(), [](unsigned char k) { return std::tolower(k); });
      if (!word.empty() && (word[0] == '+' || word[0] == '-')) word.erase(0, 1);
      const bool nan_or_inf = word == "nan" || word == "inf" || word == "infinity";
      PUSH_CHECK(v || nan_or_inf, origin, path.string(), " line ", lineno, ", column '", printable(t.names[i]), "': '",
                 printable(c), "' is not a number (plain decimals only: 12, -0.5, 3e-4)");
      PUSH_CHECK(v && std::isfinite(*v), origin, path.string(), " line ", lineno, ", column '", printable(t.names[i]),
                 "': ", printable(c), " (NaN or Inf) is not allowed");
      row[i] = *v;
    }
    t.rows.push_back(std::move(row));
    t.lines.push_back(lineno);
  }
  PUSH_CHECK(!t.rows.empty(), origin, "'", path.string(), "' has no data rows");
  return t;
}

/// The networks train in float32: a cell finite as a double (1e39) may not be one there.
double in_float32_range(const Table& t, size_t row, size_t column, const char* origin) {
  const double v = t.rows[row][column];
  PUSH_CHECK(std::isfinite(static_cast<float>(v)), origin, t.source, " line ", t.lines[row], ", column '",
             printable(t.names[column]), "': ", t.rows[row][column],
             " is beyond the range of float32 (the networks' precision, at most ±3.4e38)");
  return v;
}

/// Turns a table into a data set with column `target` as the label.
Dataset from_table(const Table& t, int64_t target, Task task, const std::string& name, const char* origin) {
  const int64_t n = static_cast<int64_t>(t.rows.size()), cols = static_cast<int64_t>(t.names.size());
  PUSH_CHECK(cols >= 2, origin, "'", name, "' needs at least one feature column and a target column");
  Dataset d;
  d.name = name;
  d.task = task;
  d.target_name = t.names[target];
  // Cells stay doubles, as parsed: Standardizer computes in double and gives the networks
  // float32, so an offset (1.7e9 + k) or a tiny scale (1e-13) loses nothing on the way.
  auto x = torch::empty({n, cols - 1}, torch::kFloat64);
  auto xa = x.accessor<double, 2>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0, k = 0; c < cols; ++c) {
      if (c != target) xa[i][k++] = in_float32_range(t, i, c, origin);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    if (c != target) d.feature_names.push_back(t.names[c]);
  }
  d.x = x;
  if (task == Task::regression) {
    auto y = torch::empty({n, 1}, torch::kFloat64);
    auto ya = y.accessor<double, 2>();
    for (int64_t i = 0; i < n; ++i) ya[i][0] = in_float32_range(t, i, target, origin);
    d.y = y;
  } else {
    std::set<double> distinct;
    for (int64_t i = 0; i < n; ++i) {
      const double v = t.rows[i][target];
      PUSH_CHECK(v == std::floor(v), origin, "classification target '", d.target_name, "' of '", name,
                 "' has the non-integer value ", v, " (", t.source, " line ", t.lines[i], ")");
      distinct.insert(v);
    }
    // Classes are numbered in the order of their labels; class_labels maps them back.
    d.class_labels.assign(distinct.begin(), distinct.end());
    std::map<double, int64_t> code;
    for (double v : distinct) code.emplace(v, static_cast<int64_t>(code.size()));
    std::vector<int64_t> labels(n);
    for (int64_t i = 0; i < n; ++i) labels[i] = code[t.rows[i][target]];
    d.y = torch::tensor(labels, torch::kLong);
    d.num_classes = static_cast<int64_t>(code.size());
    PUSH_CHECK(d.num_classes >= 2, origin, "classification target '", d.target_name, "' of '", name,
               "' has only one class");
  }
  return d;
}

at::Generator make_gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

/// Folder `sub` of data_dir(), checked when data_dir() is the default one (not a
/// PUSH_DATA_DIR the user named): each of the two that exists must belong to this user (or
/// root) and be writable by no one else, or another user could have planted the data.
fs::path builtin_dir(const std::string& sub) {
  const fs::path base = data_dir();
  const fs::path dir = base / sub;
  const char* named = std::getenv("PUSH_DATA_DIR");
  if (named && *named) return dir;
  for (const fs::path& p : {base, dir}) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) continue;
    const bool owned = st.st_uid == ::geteuid() || st.st_uid == 0;
    PUSH_CHECK(owned && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0, "push::data::load", "the data folder ", p.string(),
               owned ? " is writable by other users" : c10::str(" belongs to uid ", st.st_uid, ", not this user"),
               ", who could have planted its files: fix it (chmod go-w / remove it and run scripts/fetch-data), or "
               "set PUSH_DATA_DIR to a folder you trust");
  }
  return dir;
}

Dataset sklearn_set(const std::string& name) {
  const char* origin = "push::data::load";
  auto dir = builtin_dir("sklearn");
  auto file = [&](const std::string& f) {
    auto p = dir / f;
    PUSH_CHECK(fs::exists(p), origin, "built-in data set '", name, "' is not installed (no ", p.string(),
               "); run scripts/fetch-data");
    return p;
  };
  if (name == "iris" || name == "wine" || name == "breast_cancer") {
    auto t = read_table(file(name == "wine" ? "wine_data.csv" : name + ".csv"), ',', 1, false, origin);
    auto d = from_table(t, static_cast<int64_t>(t.names.size()) - 1, Task::classification, name, origin);
    d.target_name = "class";
    return d;
  }
  if (name == "digits") {
    auto t = read_table(file("digits.csv"), ',', 0, false, origin);
    auto d = from_table(t, static_cast<int64_t>(t.names.size()) - 1, Task::classification, name, origin);
    d.target_name = "digit";
    d.x = d.x.reshape({-1, 1, 8, 8});
    return d;
  }
  if (name == "boston_house_prices") {
    auto t = read_table(file("boston_house_prices.csv"), ',', 1, true, origin);
    return from_table(t, static_cast<int64_t>(t.names.size()) - 1, Task::regression, name, origin);
  }
  // diabetes: features and target in two whitespace-separated files.
  auto t = read_table(file("diabetes_data_raw.csv"), ' ', 0, false, origin);
  auto target = read_table(file("diabetes_target.csv"), ' ', 0, false, origin);
  PUSH_CHECK(t.rows.size() == target.rows.size(), origin, "diabetes: ", t.rows.size(), " rows of features but ",
             target.rows.size(), " targets");
  t.names = {"age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6", "progression"};
  for (size_t i = 0; i < t.rows.size(); ++i) t.rows[i].push_back(target.rows[i].at(0));
  return from_table(t, 10, Task::regression, name, origin);
}

}  // namespace

const char* to_string(Task task) { return task == Task::regression ? "regression" : "classification"; }

Task parse_task(const std::string& text) {
  if (text == "regression") return Task::regression;
  if (text == "classification") return Task::classification;
  throw Error("[push::data::parse_task] unknown task '" + text + "' (expected regression or classification)");
}

std::vector<int64_t> Dataset::input_shape() const {
  auto s = x.sizes().vec();
  s.erase(s.begin());
  return s;
}

Dataset Dataset::subset(const torch::Tensor& index) const {
  Dataset d = *this;
  d.x = x.index_select(0, index);
  d.y = y.index_select(0, index);
  return d;
}

Dataset load_csv(const fs::path& path, const CsvOptions& options) {
  const char* origin = "push::data::load_csv";
  auto t = read_table(path, ',', 0, true, origin);
  int64_t target = static_cast<int64_t>(t.names.size()) - 1;
  if (!options.target.empty()) {
    auto it = std::find(t.names.begin(), t.names.end(), options.target);
    if (it == t.names.end()) {
      std::string cols;
      for (const auto& n : t.names) cols += (cols.empty() ? "" : ", ") + n;
      throw Error(c10::str("[", origin, "] unknown target column '", printable(options.target), "' in ", path.string(),
                           " (columns: ", printable(cols, 200), ")"));
    }
    target = it - t.names.begin();
  }
  return from_table(t, target, options.task.value_or(Task::regression), path.stem().string(), origin);
}

Dataset synthetic_gap(int64_t points, uint64_t seed, double noise) {
  auto gen = make_gen(seed);
  const int64_t half = points / 2;
  auto u = torch::rand({points, 1}, gen, torch::kFloat32) * 2.5;
  auto x = torch::cat({u.narrow(0, 0, half) - 4.0, u.narrow(0, half, points - half) + 1.5});
  auto y = torch::sin(x) + noise * torch::randn({points, 1}, gen, torch::kFloat32);
  Dataset d;
  d.name = "sine-gap";
  d.x = x;
  d.y = y;
  d.feature_names = {"x"};
  d.target_name = "y";
  return d;
}

std::vector<std::string> builtin_names() {
  return {"sine-gap", "boston_house_prices", "diabetes", "iris", "wine", "breast_cancer", "digits", "fashion-mnist"};
}

fs::path data_dir() {
  if (const char* d = std::getenv("PUSH_DATA_DIR"); d && *d) return d;
  if (const char* c = std::getenv("XDG_CACHE_HOME"); c && *c) return fs::path(c) / "push" / "data";
  const char* home = std::getenv("HOME");
  // Never a shared fallback such as /tmp, where another user could plant the data first.
  PUSH_CHECK(home && *home, "push::data",
             "HOME is not set, so the built-in data sets have no folder of this user's: "
             "set PUSH_DATA_DIR to one (and run scripts/fetch-data with it set)");
  return fs::path(home) / ".cache" / "push" / "data";
}

Dataset load(const std::string& spec, const CsvOptions& options, uint64_t seed) {
  const char* origin = "push::data::load";
  auto names = builtin_names();
  if (std::find(names.begin(), names.end(), spec) != names.end()) {
    PUSH_CHECK(options.target.empty(), origin, "--target applies to CSV files, not the built-in set '", spec, "'");
    if (spec == "sine-gap") return synthetic_gap(512, seed);
    if (spec == "fashion-mnist") {
      auto dir = builtin_dir("fashion-mnist");
      PUSH_CHECK(fs::exists(dir), origin, "built-in data set 'fashion-mnist' is not installed (no ", dir.string(),
                 "); run scripts/fetch-data");
      return load_idx(dir, true);
    }
    return sklearn_set(spec == "boston" ? "boston_house_prices" : spec);
  }
  fs::path p(spec);
  if (fs::is_directory(p)) {
    PUSH_CHECK(options.target.empty(), origin, "--target applies to CSV files, not the IDX folder '", printable(spec),
               "' (its labels are the target)");
    return load_idx(p, true);
  }
  if (!fs::exists(p)) {
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    throw Error(c10::str("[", origin, "] no data set or file named '", spec, "' (built-in: ", all, ")"));
  }
  return load_csv(p, options);
}

std::pair<Dataset, Dataset> split(const Dataset& all, double test_fraction, uint64_t seed) {
  const char* origin = "push::data::split";
  PUSH_CHECK(test_fraction > 0 && test_fraction < 1, origin, "test fraction must be in (0, 1), got ", test_fraction);
  const int64_t n = all.size();
  const int64_t n_test = static_cast<int64_t>(std::llround(test_fraction * static_cast<double>(n)));
  PUSH_CHECK(n_test >= 1 && n_test < n, origin, "test fraction ", test_fraction, " of ", n,
             " rows leaves an empty training or test set");
  auto gen = make_gen(push::detail::mix_seed(seed, push::detail::seed_purpose::kSplit));
  auto perm = torch::randperm(n, gen, torch::kLong);
  return {all.subset(perm.narrow(0, n_test, n - n_test)), all.subset(perm.narrow(0, 0, n_test))};
}

fs::path idx_directory(const std::string& spec) {
  if (spec == "fashion-mnist") return data_dir() / "fashion-mnist";
  std::error_code ec;
  return fs::is_directory(spec, ec) ? fs::path(spec) : fs::path();
}

std::pair<Dataset, Dataset> load_split(const std::string& spec, const CsvOptions& options, double test_fraction,
                                       uint64_t seed) {
  const fs::path idx_dir = idx_directory(spec);
  if (!idx_dir.empty()) {
    auto train = load(spec, options, seed);
    auto test = load_idx(idx_dir, false);
    test.name = train.name;
    // Found now, not after training as "mat1 and mat2 shapes cannot be multiplied".
    PUSH_CHECK(test.input_shape() == train.input_shape(), "push::data::load_idx",
               (idx_dir / "t10k-images-idx3-ubyte").string(), " holds images of ", c10::IntArrayRef(test.input_shape()),
               ", the training images are ", c10::IntArrayRef(train.input_shape()));
    const int64_t top = test.y.max().item<int64_t>();
    PUSH_CHECK(top < train.num_classes, "push::data::load_idx", (idx_dir / "t10k-labels-idx1-ubyte").string(),
               " has label ", top, " but the training labels are 0 to ", train.num_classes - 1);
    test.num_classes = train.num_classes;
    test.class_labels = train.class_labels;
    return {train, test};
  }
  return split(load(spec, options, seed), test_fraction, seed);
}

Dataset subsample(const Dataset& d, int64_t rows, uint64_t seed) {
  if (rows <= 0 || rows >= d.size()) return d;
  auto gen = make_gen(push::detail::mix_seed(seed, push::detail::seed_purpose::kSubsample));
  return d.subset(torch::randperm(d.size(), gen, torch::kLong).narrow(0, 0, rows));
}

namespace {

/// Per column (one for images): the mean and standard deviation of `values` [N, K] in
/// double. A column whose every value is the same gets sd 1 (it becomes all zeros); one
/// whose spread is lost to double's rounding, or that overflows, is refused by name.
std::pair<torch::Tensor, torch::Tensor> column_statistics(const torch::Tensor& values,
                                                          const std::vector<std::string>& names) {
  const char* origin = "push::data::Standardizer";
  const auto v = values.to(torch::kCPU, torch::kFloat64).contiguous();
  auto mean = v.mean(0);
  auto sd = v.size(0) > 1 ? v.std(0) : torch::zeros_like(mean);
  const auto m = mean.accessor<double, 1>();
  auto s = sd.accessor<double, 1>();
  for (int64_t k = 0; k < mean.size(0); ++k) {
    const std::string name = k < static_cast<int64_t>(names.size()) ? names[k] : "#" + std::to_string(k + 1);
    PUSH_CHECK(std::isfinite(m[k]) && std::isfinite(s[k]), origin, "column '", printable(name),
               "' spans too wide a range to standardise (its spread overflows a double): rescale it");
    // Identical values give exactly 0; a spread of 1e-12 of the values' size is rounding.
    PUSH_CHECK(s[k] == 0 || s[k] > 1e-12 * std::abs(m[k]), origin, "column '", printable(name), "' varies by only ",
               s[k], " around ", m[k],
               " (a relative spread below 1e-12, which rounding would dominate): subtract an "
               "offset first");
    if (s[k] == 0) s[k] = 1;
  }
  return {mean, sd};
}

}  // namespace

Standardizer Standardizer::fit(const Dataset& train) {
  Standardizer s;
  s.images = train.x.dim() > 2;
  if (s.images) {
    // Pixels: one mean and sd over all of them, computed in float32 (they are bytes / 255).
    const auto x = train.x.to(torch::kFloat32);
    s.x_mean = x.mean().to(torch::kFloat64);
    s.x_std = x.std().to(torch::kFloat64);
    s.x_std = torch::where(s.x_std > 1e-12, s.x_std, torch::ones_like(s.x_std));
  } else {
    std::tie(s.x_mean, s.x_std) = column_statistics(train.x.reshape({train.size(), -1}), train.feature_names);
  }
  if (train.task == Task::regression) {
    std::tie(s.y_mean, s.y_std) = column_statistics(train.y.reshape({train.size(), -1}), {train.target_name});
  }
  return s;
}

torch::Tensor Standardizer::scale_x(const torch::Tensor& x) const {
  if (images) return (x.to(torch::kFloat32) - x_mean.to(torch::kFloat32)) / x_std.to(torch::kFloat32);
  return ((x.to(torch::kFloat64) - x_mean.to(x.device())) / x_std.to(x.device())).to(torch::kFloat32);
}

Dataset Standardizer::apply(const Dataset& d) const {
  Dataset out = d;
  out.x = scale_x(d.x);
  if (d.task == Task::regression && y_mean.defined()) {
    out.y = ((d.y.to(torch::kFloat64) - y_mean.to(d.y.device())) / y_std.to(d.y.device())).to(torch::kFloat32);
  }
  return out;
}

torch::Tensor Standardizer::unscale_mean(const torch::Tensor& mean) const {
  if (!y_mean.defined()) return mean;
  return mean.to(torch::kCPU, torch::kFloat64) * y_std + y_mean;
}

torch::Tensor Standardizer::unscale_variance(const torch::Tensor& variance) const {
  if (!y_std.defined()) return variance;
  return variance.to(torch::kCPU, torch::kFloat64) * y_std.pow(2);
}

}  // namespace push::data
