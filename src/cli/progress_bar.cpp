// The progress bar of push train.
#include "progress_bar.h"

#include <cstdio>
#include <string>

namespace push::cli {

ProgressBar::~ProgressBar() {
  if (open_line_) std::fprintf(stderr, "\n");
}

void ProgressBar::start(int64_t first_epoch, int64_t last_epoch) {
  first_ = first_epoch;
  last_ = last_epoch;
  since_start_ = Stopwatch();
  last_print_ = -1;
  started_ = true;
}

void ProgressBar::update(const bayes::Progress& p) {
  if (!quiet_ && p.creating) return creating(p);
  if (quiet_ || !started_) return;
  const int64_t total = (last_ - first_) * particles_;
  const int64_t done = (p.epoch - 1 - first_) * particles_ + p.particles_done;
  const double elapsed = since_start_.seconds();
  const bool end = done >= total;
  if (!end && elapsed - last_print_ < 0.1) return;
  last_print_ = elapsed;
  const double eta = done > 0 ? elapsed / done * (total - done) : 0;
  const int width = 30, filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%s%s] epoch %lld/%lld  particle %lld/%d  loss %.4f  ETA %.1fs  ",
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
               static_cast<long long>(p.epoch), static_cast<long long>(last_), static_cast<long long>(p.particles_done),
               particles_, p.loss, eta);
  if (end) std::fprintf(stderr, "\n");
  open_line_ = !end;
}

void ProgressBar::creating(const bayes::Progress& p) {
  // Many particles take a while to make (10,000 of the default MLP: about 2 s on 2 cores).
  const double elapsed = since_start_.seconds();
  const bool end = p.particles_done >= p.particles;
  if (!open_line_ && (end || elapsed < 1.0)) return;  // quick: no line at all
  if (!end && elapsed - last_print_ < 0.1) return;
  last_print_ = elapsed;
  std::fprintf(stderr, "\rcreating particles %lld/%lld  ", static_cast<long long>(p.particles_done),
               static_cast<long long>(p.particles));
  if (end) std::fprintf(stderr, "\n");
  open_line_ = !end;
}

}  // namespace push::cli
