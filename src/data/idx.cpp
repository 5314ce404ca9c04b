// IDX files (the MNIST format): a big-endian header (magic 0x00000803 for images, whose
// dimensions follow, 0x00000801 for labels), then one unsigned byte per pixel or label.
// LibTorch's MNIST reader trusts the header: a truncated file trains on what is there, a
// cut header trips an internal assertion. This reader checks every size before it builds
// a tensor.
#include <push/data/dataset.h>

#include <torch/torch.h>

#include <cstring>
#include <fstream>

namespace push::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kOrigin = "push::data::load_idx";

struct IdxFile {
  std::vector<int64_t> dims;  // count first
  std::string bytes;          // the data after the header
};

/// Reads an IDX file of unsigned bytes with `rank` dimensions and checks its size: the
/// header first, against the file's size, and only then the data (a link to a device, or
/// a file of gigabytes with a wrong header, is refused before its data are read).
IdxFile read_idx(const fs::path& path, uint32_t magic, int rank) {
  PUSH_CHECK(fs::exists(path), kOrigin, "no IDX file ", path.string());
  PUSH_CHECK(fs::is_regular_file(path), kOrigin, path.string(),
             " is not a regular file (a FIFO, a socket or a device?): give the IDX file itself");
  std::ifstream in(path, std::ios::binary);
  PUSH_CHECK(in, kOrigin, "cannot open ", path.string());
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  PUSH_CHECK(!ec, kOrigin, "cannot read ", path.string(), ": ", ec.message());
  const size_t header = 4 * (1 + static_cast<size_t>(rank));
  PUSH_CHECK(size >= header, kOrigin, path.string(), " is truncated: ", size, " bytes, shorter than its ", header,
             "-byte header");
  std::string head(header, '\0');
  PUSH_CHECK(in.read(head.data(), static_cast<std::streamsize>(header)), kOrigin, "cannot read ", path.string());
  auto word = [&](int i) {
    const auto* p = reinterpret_cast<const unsigned char*>(head.data()) + 4 * i;
    return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
  };
  PUSH_CHECK(word(0) == magic, kOrigin, path.string(), " has the magic number 0x", std::hex, word(0),
             " in its header, expected 0x", magic, std::dec, " (unsigned bytes, ", rank, " dimensions)");
  IdxFile f;
  size_t expected = 1;
  for (int i = 1; i <= rank; ++i) {
    f.dims.push_back(word(i));
    PUSH_CHECK(word(i) > 0, kOrigin, path.string(), ": dimension ", i, " of its header is 0");
    PUSH_CHECK(expected <= (size_t{1} << 40) / word(i), kOrigin, path.string(),
               ": its header announces an absurd size");
    expected *= word(i);
  }
  const uintmax_t have = size - header;
  PUSH_CHECK(have >= expected, kOrigin, path.string(), " is truncated: its header announces ", expected,
             " bytes of data, the file holds ", have);
  PUSH_CHECK(have == expected, kOrigin, path.string(), " has ", have - expected, " bytes after the ", expected,
             " its header announces");
  f.bytes.resize(expected);
  PUSH_CHECK(in.read(f.bytes.data(), static_cast<std::streamsize>(expected)), kOrigin, "cannot read ", path.string(),
             " (it changed while being read?)");
  return f;
}

torch::Tensor bytes_to_tensor(const IdxFile& f) {
  auto t = torch::empty(f.dims, torch::kUInt8);
  std::memcpy(t.data_ptr(), f.bytes.data(), f.bytes.size());
  return t;
}

}  // namespace

Dataset load_idx(const fs::path& dir, bool train) {
  const std::string part = train ? "train" : "t10k";
  const auto images_path = dir / (part + "-images-idx3-ubyte");
  const auto labels_path = dir / (part + "-labels-idx1-ubyte");
  const auto images = read_idx(images_path, 0x803, 3);
  const auto labels = read_idx(labels_path, 0x801, 1);
  PUSH_CHECK(images.dims[0] == labels.dims[0], kOrigin, dir.string(), ": ", images.dims[0], " images but ",
             labels.dims[0], " labels (", images_path.filename().string(), ", ", labels_path.filename().string(), ")");
  Dataset d;
  d.name = dir.filename().string();
  d.task = Task::classification;
  d.x = bytes_to_tensor(images).unsqueeze(1).to(torch::kFloat32).div_(255);
  d.y = bytes_to_tensor(labels).to(torch::kLong);
  d.num_classes = d.y.max().item<int64_t>() + 1;
  // As a CSV with one class is: accuracy 1 and nll 0 on such data would mean nothing.
  PUSH_CHECK(!train || d.num_classes >= 2, kOrigin, labels_path.string(), ": every label is ", d.num_classes - 1,
             "; classification needs at least two classes in the training set");
  // Labels are class numbers 0 to K-1: a training set that skips one (a stray byte of 99
  // in a 10-class set) would silently train a K = 100 problem.
  if (train) {
    const auto counts = torch::bincount(d.y, {}, d.num_classes);
    const auto missing = (counts == 0).nonzero();
    if (missing.numel() > 0) {
      const int64_t first_missing = missing[0][0].item<int64_t>();
      const int64_t top = d.num_classes - 1;
      const int64_t where = (d.y == top).nonzero()[0][0].item<int64_t>();
      throw Error(c10::str("[", kOrigin, "] ", labels_path.string(), ": its labels go up to ", top, " (item ", where,
                           ") but no item has label ", first_missing,
                           "; IDX labels are class numbers 0 to K-1, "
                           "each present in the training set"));
    }
  }
  for (int64_t k = 0; k < d.num_classes; ++k) d.class_labels.push_back(static_cast<double>(k));
  d.target_name = "label";
  return d;
}

}  // namespace push::data
