// Infer's checkpoint: the particles (push::Push::save, collective with a world) and the
// algorithm's counters in infer.meta, written by rank 0; every step ends with every rank
// knowing whether all got through it.
#include <push/bayes/infer.h>

#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/files.h"
#include "core/sealed_text.h"

namespace push::bayes {

void Infer::save(const std::filesystem::path& dir) {
  ensure_created();
  // With a world every step ends with every rank knowing whether all got through it.
  std::exception_ptr error;
  try {
    std::filesystem::create_directories(dir);
  } catch (...) {
    error = std::current_exception();
  }
  training_.exchange({}, error, "push::bayes::Infer::save (folder)");
  dist_->save(dir / "particles");  // collective with a world
  // One rank writes the algorithm's own state (the same on every rank).
  if (dist_->rank() == 0) {
    try {
      write_meta(dir);
    } catch (...) {
      error = std::current_exception();
    }
  }
  training_.exchange({}, error, "push::bayes::Infer::save");
}

void Infer::write_meta(const std::filesystem::path& dir) const {
  std::ostringstream out;
  out << std::setprecision(17) << "algorithm " << name() << "\nparticles " << options().particles() << "\nepochs "
      << epochs_done_ << "\nlosses";
  for (double l : losses_) out << ' ' << l;
  out << "\n";
  // Each particle's best and last epoch: id best best_epoch last last_epoch.
  for (const auto& [pid, l] : particle_losses_) {
    out << "particle_losses " << pid << ' ' << l.best << ' ' << l.best_epoch << ' ' << l.last << ' ' << l.last_epoch
        << "\n";
  }
  // Sealed (every byte checked on load), synced and renamed into place: a crash leaves
  // the old counters or the new ones.
  push::detail::write_file_atomic(dir / "infer.meta", push::detail::seal(out.str()), "push::bayes::Infer::save");
}

void Infer::load(const std::filesystem::path& dir) {
  const char* origin = "push::bayes::Infer::load";
  ensure_created();
  int64_t epochs = -1;
  std::vector<double> losses;
  std::map<Pid, ParticleLosses> particle_losses;
  std::exception_ptr error;
  try {
    read_meta(dir, epochs, losses, particle_losses);
  } catch (...) {
    error = std::current_exception();
  }
  training_.exchange({}, error, origin);  // every rank read the same checkpoint, or all throw
  dist_->load(dir / "particles");
  epochs_done_ = epochs;
  losses_ = std::move(losses);
  particle_losses_ = std::move(particle_losses);
}

void Infer::read_meta(const std::filesystem::path& dir, int64_t& epochs, std::vector<double>& losses,
                      std::map<Pid, ParticleLosses>& particle_losses) const {
  const char* origin = "push::bayes::Infer::load";
  PUSH_CHECK(std::filesystem::exists(dir / "infer.meta"), origin, "no checkpoint at ", dir, " (missing infer.meta)");
  std::string body;
  try {
    body = push::detail::unseal(push::detail::read_file(dir / "infer.meta", nullptr), "infer.meta");
  } catch (const Error& e) {
    throw Error(c10::str("[", origin, "] checkpoint ", dir, ": ", e.what()));
  }
  std::istringstream in(body);
  std::string key, algorithm;
  int64_t particles = -1;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ls >> key;
    if (key == "algorithm") ls >> algorithm;
    if (key == "particles") ls >> particles;
    if (key == "epochs") ls >> epochs;
    if (key == "losses") {
      double l;
      while (ls >> l) losses.push_back(l);
    }
    if (key == "particle_losses") {
      // Checkpoints written before particles' losses were kept have none: the record
      // starts again at the next epoch.
      Pid pid = -1;
      ParticleLosses l;
      ls >> pid >> l.best >> l.best_epoch >> l.last >> l.last_epoch;
      PUSH_CHECK(ls && l.best_epoch >= 1 && l.best_epoch <= l.last_epoch, origin, "checkpoint ", dir,
                 " has a damaged infer.meta (particle_losses)");
      particle_losses[pid] = l;
    }
  }
  PUSH_CHECK(algorithm == name(), origin, "checkpoint ", dir, " holds algorithm '", algorithm, "', not '", name(), "'");
  PUSH_CHECK(particles == options().particles(), origin, "checkpoint ", dir, " holds ", particles, " particles, not ",
             options().particles());
  PUSH_CHECK(epochs >= 0 && static_cast<int64_t>(losses.size()) == epochs, origin, "checkpoint ", dir,
             " has a damaged infer.meta");
  for (const auto& [pid, l] : particle_losses) {
    PUSH_CHECK(pid >= 0 && pid < particles && l.last_epoch <= epochs, origin, "checkpoint ", dir,
               " has a damaged infer.meta (particle_losses)");
  }
}

}  // namespace push::bayes
