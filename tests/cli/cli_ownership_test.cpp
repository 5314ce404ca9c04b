// What push train may replace and what it trusts when it resumes: a folder is its own only
// when it holds push train's marker (.push-train, sealed), --save and --out are published
// both or neither, and every byte of a checkpoint is checked before a resumed run trains.
#include "cli_test_util.h"

#include <signal.h>

#include <chrono>

#include "core/clock.h"

namespace {
using namespace push::testing;
using namespace std::chrono_literals;
using push::detail::Clock;

TEST_F(Cli, UserFilesNamedLikePushOutputsAreNeverReplaced) {
  // Folders holding only the user's own files, named as push train names its outputs.
  write("preds/predictions.csv", "mine");
  write("pics/loss.png", "mine");
  write("cfg/config.json", "{\"mine\": true}");
  write("forged/.push-train", "push train outputs\nend 00000000\n");
  write("forged/metrics.json", "mine");
  const std::pair<std::string, std::string> cases[] = {
      {"--out preds", "preds/predictions.csv"},
      {"--out pics", "pics/loss.png"},
      {"--out forged", "forged/metrics.json"},
      {"--save cfg --out o", "cfg/config.json"},
  };
  for (const auto& [args, file] : cases) {
    const std::string before = slurp(dir_ / file);
    auto r = run("--epochs 1 --particles 2 --quiet " + args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find("no valid .push-train marker"), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << args << ": " << r.err;
    EXPECT_EQ(slurp(dir_ / file), before) << args;
  }
  // push train's own outputs carry the marker, and are replaced.
  ASSERT_EQ(run("--epochs 1 --particles 2 --quiet --save ck --out o").code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "o" / ".push-train"));
  EXPECT_TRUE(fs::exists(dir_ / "ck" / ".push-train"));
  auto again = run("--epochs 2 --particles 2 --quiet --save ck --out o");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(metrics("o")["run"]["epochs"], 2);
  // A marker of the other kind is not enough: an --out folder is no checkpoint.
  auto swapped = run("--epochs 1 --particles 2 --quiet --save o --out o2");
  EXPECT_NE(swapped.code, 0);
  EXPECT_NE(swapped.err.find("not a push train checkpoint"), std::string::npos) << swapped.err;
  // The marker lists what push train wrote, as it wrote it: an output the user edited, a
  // file added under one of push's names (band.csv is not written for this run's data,
  // but the marker decides, not the name), a file put inside the checkpoint's folders.
  const std::pair<std::string, std::string> changed[] = {
      {"o/predictions.csv", "'predictions.csv', changed since push train wrote it"},
      {"o/notes.txt", "'notes.txt', which push train did not write there"},
      {"ck/checkpoint/notes.txt", "also holds 'checkpoint/notes.txt'"},
      {"ck/checkpoint/particles/u/x.txt", "also holds 'checkpoint/particles/u'"},
      // A particle file the manifest does not list, and one overwritten: the manifest decides.
      {"ck/checkpoint/particles/particle-7.pt", "also holds 'checkpoint/particles/particle-7.pt'"},
      {"ck/checkpoint/particles/particle-1.pt", "'checkpoint/particles/particle-1.pt' changed since push train wrote"},
      {"ck/config.json", "'config.json' changed since push train wrote it"},
  };
  for (const auto& [file, needle] : changed) {
    const bool existed = fs::exists(dir_ / file);
    const std::string before = existed ? slurp(dir_ / file) : "";
    write(file, before + "mine");
    auto r = run("--epochs 1 --particles 2 --quiet --save ck --out o");
    EXPECT_NE(r.code, 0) << file;
    EXPECT_NE(r.err.find(needle), std::string::npos) << file << ": " << r.err;
    EXPECT_EQ(slurp(dir_ / file), before + "mine") << file;
    if (existed) {
      write(file, before);
    } else {
      fs::remove(dir_ / file);
      fs::remove(dir_ / "ck/checkpoint/particles/u");  // the folder made for the last one, if any
    }
  }
  // A file push train wrote and the user removed is said to be removed, not changed.
  const std::string metrics_before = slurp(dir_ / "o" / "metrics.json");
  fs::remove(dir_ / "o" / "metrics.json");
  auto removed = run("--epochs 1 --particles 2 --quiet --save ck --out o");
  EXPECT_NE(removed.code, 0);
  EXPECT_NE(removed.err.find("lacks 'metrics.json', removed since push train wrote it"), std::string::npos)
      << removed.err;
  write("o/metrics.json", metrics_before);
  // A marker that is a link to a real one is not a marker.
  fs::create_directories(dir_ / "linked");
  fs::create_symlink(dir_ / "o" / ".push-train", dir_ / "linked" / ".push-train");
  auto linked = run("--epochs 1 --particles 2 --quiet --out linked");
  EXPECT_NE(linked.err.find("no valid .push-train marker"), std::string::npos) << linked.err;
  ASSERT_EQ(run("--epochs 1 --particles 2 --quiet --save ck --out o").code, 0);  // everything restored
}

TEST_F(Cli, SaveAndOutArePublishedBothOrNeither) {
  ASSERT_EQ(run("--epochs 1 --particles 2 --quiet --save ck --out o").code, 0);
  const std::string config = slurp(dir_ / "ck" / "config.json");
  // While the next run trains, --out becomes the user's folder: it cannot be published,
  // so the new checkpoint is not published either.
  const pid_t pid = start("--epochs 2000 --particles 2 --save ck --out o", dir_ / "log");
  const bool training = Clock::poll_until(Clock::deadline_after(60s), 5ms,
                                          [&] { return slurp(dir_ / "log").find("ETA") != std::string::npos; });
  write("o/notes.txt", "mine");
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(training) << slurp(dir_ / "log");
  EXPECT_EQ(WEXITSTATUS(status), 1) << slurp(dir_ / "log");
  EXPECT_NE(slurp(dir_ / "log").find("notes.txt"), std::string::npos) << slurp(dir_ / "log");
  EXPECT_EQ(slurp(dir_ / "ck" / "config.json"), config);
  EXPECT_EQ(slurp(dir_ / "o" / "notes.txt"), "mine");
  EXPECT_EQ(entries(), (std::vector<std::string>{"ck", "log", "o"}));  // no staging folder left
}

TEST_F(Cli, AReadOnlyOutIsRefusedBeforeTraining) {
  ASSERT_EQ(run("--epochs 1 --particles 2 --quiet --out o").code, 0);
  fs::permissions(dir_ / "o", fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  auto r = run("--epochs 1000 --particles 2 --out o");
  fs::permissions(dir_ / "o", fs::perms::owner_write, fs::perm_options::add);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--out 'o' is read-only"), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  EXPECT_EQ(entries(), std::vector<std::string>{"o"});
}

TEST_F(Cli, EveryByteOfACheckpointIsCheckedBeforeTraining) {
  ASSERT_EQ(run("--epochs 3 --particles 2 --quiet --lr-schedule constant --save ck --out o").code, 0);
  const fs::path meta = dir_ / "ck" / "checkpoint" / "infer.meta";
  const std::string saved_meta = slurp(meta), saved_config = slurp(dir_ / "ck" / "config.json");
  auto edit = [&](const fs::path& file, const std::string& from, const std::string& to) {
    std::string text = slurp(file);
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    write(fs::relative(file, dir_).string(), text.replace(at, from.size(), to));
  };
  auto resume = [&] { return run("--epochs 6 --particles 2 --lr-schedule constant --resume ck --out r"); };
  auto refused = [&](const std::string& what, const std::string& needle) {
    auto r = resume();
    EXPECT_NE(r.code, 0) << what;
    EXPECT_NE(r.err.find(needle), std::string::npos) << what << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << what << ": " << r.err;
    EXPECT_EQ(r.err.find("ETA"), std::string::npos) << what << ": trained first";
    EXPECT_FALSE(fs::exists(dir_ / "r")) << what;
    write("ck/checkpoint/infer.meta", saved_meta);
    write("ck/config.json", saved_config);
  };
  // infer.meta: a loss edited, the epoch count edited, a line appended.
  edit(meta, "losses ", "losses 9");
  refused("a loss", "infer.meta fails its checksum");
  edit(meta, "epochs 3", "epochs 2");
  refused("the epochs", "infer.meta fails its checksum");
  write("ck/checkpoint/infer.meta", saved_meta + "epochs 1\n");
  refused("a line appended", "checkpoint/infer.meta fails its checksum");
  // config.json: a setting edited; the marker that covers it, removed or edited.
  edit(dir_ / "ck" / "config.json", "\"lr\": 0.01", "\"lr\": 0.02");
  refused("config.json", "its config.json fails its checksum");
  fs::remove(dir_ / "ck" / ".push-train");
  refused("no marker", "is not a push train checkpoint");
  // Without its marker the folder is no longer push train's to replace either.
  auto over = run("--epochs 3 --particles 2 --quiet --save ck --out o");
  EXPECT_NE(over.err.find("no valid .push-train marker"), std::string::npos) << over.err;
  fs::remove_all(dir_ / "ck");
  ASSERT_EQ(run("--epochs 3 --particles 2 --quiet --lr-schedule constant --save ck --out o").code, 0);
  edit(dir_ / "ck" / ".push-train", "config.json ", "config.json 0");
  refused("an edited marker", "is not a push train checkpoint");
}

TEST_F(Cli, FilesOfTwoCheckpointsCannotBeMixed) {
  const std::string args = "--particles 2 --quiet --lr-schedule constant";
  ASSERT_EQ(run(args + " --epochs 2 --save a --out o").code, 0);
  ASSERT_EQ(run(args + " --epochs 4 --save b --out o").code, 0);
  // Each file is whole and passes its own checksum; together they are not one checkpoint.
  fs::remove_all(dir_ / "a" / "checkpoint" / "particles");
  fs::copy(dir_ / "b" / "checkpoint" / "particles", dir_ / "a" / "checkpoint" / "particles");
  auto particles = run(args + " --epochs 4 --resume a --out r");
  EXPECT_NE(particles.code, 0);
  EXPECT_NE(particles.err.find("its checkpoint/particles/push.manifest fails its checksum"), std::string::npos)
      << particles.err;
  // --save checks the folder it would replace as --resume does: the mixed one is refused.
  auto over = run(args + " --epochs 2 --save a --out o");
  EXPECT_NE(over.code, 0);
  EXPECT_NE(over.err.find("'checkpoint/particles/push.manifest' changed since push train wrote it"), std::string::npos)
      << over.err;
  fs::remove_all(dir_ / "a");
  ASSERT_EQ(run(args + " --epochs 2 --save a --out o").code, 0);
  fs::copy_file(dir_ / "b" / "checkpoint" / "infer.meta", dir_ / "a" / "checkpoint" / "infer.meta",
                fs::copy_options::overwrite_existing);
  auto meta = run(args + " --epochs 3 --resume a --out r");
  EXPECT_NE(meta.code, 0);
  EXPECT_NE(meta.err.find("its checkpoint/infer.meta fails its checksum"), std::string::npos) << meta.err;
  EXPECT_FALSE(fs::exists(dir_ / "r"));
}

TEST_F(Cli, ResumeRefusesFewerEpochsAndOtherData) {
  std::ostringstream rows;
  rows << "x,y\n";
  for (int i = 0; i < 60; ++i) rows << i * 0.1 << ',' << std::sin(i * 0.1) << "\n";
  write("d.csv", rows.str());
  ASSERT_EQ(run("--data d.csv --epochs 4 --particles 2 --quiet --save ck --out o").code, 0);
  // --epochs counts every epoch: fewer than the checkpoint's is refused, not ignored.
  auto fewer = run("--data d.csv --epochs 2 --particles 2 --quiet --resume ck --out r");
  EXPECT_NE(fewer.code, 0);
  EXPECT_NE(fewer.err.find("--epochs 2 is fewer than the 4 epochs the checkpoint 'ck' has trained"), std::string::npos)
      << fewer.err;
  // As many is fine: nothing more to train, the checkpoint's networks are evaluated.
  auto same = run("--data d.csv --epochs 4 --particles 2 --quiet --resume ck --out r");
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(metrics("r")["loss_curve"].size(), 4u);
  // The same data under another path are the same data: the fingerprint decides.
  for (const std::string& path : {std::string("./d.csv"), (dir_ / "d.csv").string()}) {
    auto moved = run("--data " + path + " --epochs 4 --particles 2 --quiet --resume ck --out r");
    EXPECT_EQ(moved.code, 0) << path << ": " << moved.err;
  }
  // The data changed (one row edited): refused unless asked for.
  write("d.csv", rows.str() + "6.1,0.2\n");
  auto changed = run("--data d.csv --epochs 5 --particles 2 --quiet --resume ck --out r2");
  EXPECT_NE(changed.code, 0);
  EXPECT_NE(changed.err.find("the data differ from those it was trained on"), std::string::npos) << changed.err;
  EXPECT_EQ(lines_of(changed.err), 1) << changed.err;
  EXPECT_FALSE(fs::exists(dir_ / "r2"));
  auto allowed = run("--data d.csv --epochs 5 --particles 2 --quiet --resume ck --out r2 --allow-data-change");
  ASSERT_EQ(allowed.code, 0) << allowed.err;
  EXPECT_EQ(metrics("r2")["loss_curve"].size(), 5u);
  // --allow-data-change goes on with a file of another name too, as README says.
  write("e.csv", rows.str() + "6.2,0.1\n");
  auto renamed = run("--data e.csv --epochs 5 --particles 2 --quiet --resume ck --out r3 --allow-data-change");
  EXPECT_EQ(renamed.code, 0) << renamed.err;
}

}  // namespace
