// push::dist::Store: the job's key-value store behind push's own handle, with c10d's
// failures as push::Errors that name the call.
#include "dist_test_util.h"

#include <test_util.h>

using namespace std::chrono_literals;

TEST(DistStore, SetGetCheckWaitAndAddReachTheJobsStore) {
  push::dist::World world(push::dist::WorldOptions().master_port(push::dist::free_port()).init_timeout(30s));
  const push::dist::Store store = world.store();
  EXPECT_FALSE(store.check({"test/a"}));
  store.set("test/a", {1, 2, 3});
  EXPECT_TRUE(store.check({"test/a"}));
  store.wait({"test/a"});
  store.wait({"test/a"}, 10s);
  EXPECT_EQ(store.get("test/a"), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(store.add("test/n", 2), 2);
  EXPECT_EQ(world.store().add("test/n", 3), 5);  // every handle reaches the same store
  EXPECT_PUSH_ERROR(push::dist::Store().get("test/a"), "[push::dist::Store::get] this store handle is empty");
  // Last, so that no call after it depends on a connection whose wait gave up.
  EXPECT_PUSH_ERROR(store.wait({"test/never"}, 100ms), "[push::dist::Store::wait]");
}
