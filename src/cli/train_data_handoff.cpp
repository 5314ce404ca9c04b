#include "train_data_handoff.h"

#include <push/core/errors.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace push::cli {
namespace {

constexpr const char* kVariable = "PUSH_TRAIN_DATA_FD";
constexpr const char* kMagic = "push train rows 1";
constexpr int kSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

/// The options the rows depend on, spelled exactly (a double as its hexadecimal form).
std::string rows_key(const TrainConfig& c) {
  char fraction[64];
  std::snprintf(fraction, sizeof(fraction), "%a", c.test_fraction);
  return c10::str(c.data.size(), ":", c.data, "|", c.target.size(), ":", c.target, "|", c.task, "|", fraction, "|",
                  c.limit, "|", c.seed);
}

c10::IValue to_ivalue(const data::Dataset& d) {
  c10::List<std::string> features;
  for (const auto& f : d.feature_names) features.push_back(f);
  c10::List<double> labels;
  for (double l : d.class_labels) labels.push_back(l);
  return c10::ivalue::Tuple::create(
      {d.name, static_cast<int64_t>(d.task), d.x, d.y, features, d.target_name, d.num_classes, labels});
}

data::Dataset from_ivalue(const c10::IValue& v) {
  const auto& e = v.toTupleRef().elements();
  PUSH_CHECK(e.size() == 8, "push train", "the rows handed over (", kVariable, ") are malformed");
  data::Dataset d;
  d.name = e[0].toStringRef();
  d.task = e[1].toInt() == static_cast<int64_t>(data::Task::classification) ? data::Task::classification
                                                                            : data::Task::regression;
  d.x = e[2].toTensor();
  d.y = e[3].toTensor();
  for (const auto& f : e[4].toList()) d.feature_names.push_back(f.get().toStringRef());
  d.target_name = e[5].toStringRef();
  d.num_classes = e[6].toInt();
  for (const auto& l : e[7].toList()) d.class_labels.push_back(l.get().toDouble());
  return d;
}

}  // namespace

void hand_rows_to_ranks(const TrainConfig& c, const LoadedRows& rows) {
  const std::vector<char> bytes = torch::pickle_save(
      c10::ivalue::Tuple::create({std::string(kMagic), rows_key(c), to_ivalue(rows.first), to_ivalue(rows.second)}));
  // Inherited by the ranks (no close-on-exec), sealed before any of them starts.
  const int fd = ::memfd_create("push-train-rows", MFD_ALLOW_SEALING);
  PUSH_CHECK(fd >= 0, "push train", "cannot make a memory file to hand the data to the ranks: ", std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      PUSH_CHECK(false, "push train", "cannot write the data for the ranks to a memory file: ", std::strerror(error));
    }
    done += static_cast<std::size_t>(n);
  }
  PUSH_CHECK(::fcntl(fd, F_ADD_SEALS, kSeals) == 0, "push train",
             "cannot seal the data for the ranks: ", std::strerror(errno));
  ::setenv(kVariable, std::to_string(fd).c_str(), 1);
}

std::optional<LoadedRows> rows_from_launcher(const TrainConfig& c) {
  const char* text = std::getenv(kVariable);
  if (text == nullptr) return std::nullopt;
  int fd = -1;
  const char* end = text + std::strlen(text);
  if (std::from_chars(text, end, fd).ptr != end || fd < 0) return std::nullopt;
  // Only a memfd sealed against every change is push train's: anything else (a stray
  // variable, a descriptor that is something else in this process) is not read.
  if (::fcntl(fd, F_GET_SEALS) != kSeals) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  std::vector<char> bytes(static_cast<std::size_t>(st.st_size));
  // pread: the ranks share the file's offset.
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    PUSH_CHECK(n > 0, "push train", "cannot read the data handed over (", kVariable, "): ", std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  ::unsetenv(kVariable);
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception&) {
    PUSH_CHECK(false, "push train", "the data handed over (", kVariable, ") is not what push train wrote");
  }
  PUSH_CHECK(value.isTuple() && value.toTupleRef().elements().size() == 4 &&
                 value.toTupleRef().elements()[0].isString() &&
                 value.toTupleRef().elements()[0].toStringRef() == kMagic,
             "push train", "the data handed over (", kVariable, ") is not what push train wrote");
  const auto& e = value.toTupleRef().elements();
  if (!e[1].isString() || e[1].toStringRef() != rows_key(c)) return std::nullopt;
  return LoadedRows{from_ivalue(e[2]), from_ivalue(e[3])};
}

}  // namespace push::cli
