// The core without Python: every backend on the simulated device, several streams launching at
// once from several threads, graphs captured, replayed and destroyed while others run, then a
// shutdown. Exits non-zero with a message on the first wrong count or order.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fastpath/callback.hpp"
#include "fastpath/engine.hpp"
#include "sim_device.hpp"

namespace hd = fastpath::hostdispatch;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

void check(const hd::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "FAILED: %s: %s\n", what, st.error.c_str());
    std::exit(1);
  }
}

void run(const char* label, hd::Mode mode, hd::SimDeviceConfig config, hd::Backend expected) {
  hd::EngineOptions opts;
  opts.mode = mode;
  opts.doorbell.max_slots = 24;  // the queue ring's one operation a callback lets ~5 graphs queue up
  opts.doorbell.safety_poll_ns = 1'000'000;
  auto device = std::make_shared<hd::SimDevice>(config);
  auto engine = hd::Engine::create(opts, device, "", hd::RuntimeModePolicy{});
  expect(engine->selection().backend == expected, std::string(label) + ": picked " + hd::name_of(engine->selection().backend));

  constexpr int kStreams = 4, kEager = 2000, kGraphs = 40, kReplays = 25;
  std::vector<std::unique_ptr<hd::SimStream>> streams;
  std::vector<std::shared_ptr<hd::CallLog>> logs;
  for (int s = 0; s < kStreams; ++s) {
    streams.push_back(std::make_unique<hd::SimStream>(256));
    logs.push_back(std::make_shared<hd::CallLog>());
  }
  // Eager: one launching thread per stream; each stream's tags must come out in order.
  std::vector<std::thread> launchers;
  for (int s = 0; s < kStreams; ++s) {
    launchers.emplace_back([&, s] {
      for (int i = 0; i < kEager; ++i) {
        auto cb = std::make_shared<hd::AppendTag>(logs[s], i);
        cb->set_posted(i % 3 == 0);  // posted and waiting callbacks keep one order
        check(engine->launch(streams[s]->handle(), std::move(cb)), "eager launch");
      }
    });
  }
  // Meanwhile, on a fifth stream: graphs captured, replayed and destroyed, so slots turn over.
  hd::SimStream graph_stream(256);
  auto graph_log = std::make_shared<hd::CallLog>();
  for (int g = 0; g < kGraphs; ++g) {
    graph_stream.begin_capture();
    for (int k = 0; k < 3; ++k) {
      auto cb = std::make_shared<hd::AppendTag>(graph_log, g * 3 + k);
      cb->set_posted(k == 1);
      check(engine->launch(graph_stream.handle(), std::move(cb)), "captured launch");
    }
    auto body = graph_stream.end_capture();
    for (int r = 0; r < kReplays; ++r) {
      engine->announce(3);
      check(graph_stream.replay(body), "replay");
    }
  }  // each body dies after its last queued replay: the slots go back while others run
  for (auto& t : launchers) t.join();
  for (auto& s : streams) expect(s->synchronize(30.0), std::string(label) + ": a stream did not finish");
  for (auto& s : streams) check(engine->synchronize(s->handle()), "synchronize");
  expect(graph_stream.synchronize(30.0), std::string(label) + ": the graph stream did not finish");
  check(engine->synchronize(graph_stream.handle()), "synchronize");  // and the posted callbacks

  for (int s = 0; s < kStreams; ++s) {
    const auto tags = logs[s]->tags();
    bool in_order = static_cast<int>(tags.size()) == kEager;
    for (int i = 0; in_order && i < kEager; ++i) in_order = tags[i] == i;
    expect(in_order, std::string(label) + ": stream " + std::to_string(s) + " ran " + std::to_string(tags.size()) +
                         " callbacks, or out of order");
  }
  const auto tags = graph_log->tags();
  bool graphs_ok = static_cast<int>(tags.size()) == kGraphs * kReplays * 3;
  for (int g = 0; graphs_ok && g < kGraphs; ++g) {
    for (int r = 0; graphs_ok && r < kReplays; ++r) {
      for (int k = 0; graphs_ok && k < 3; ++k) graphs_ok = tags[(g * kReplays + r) * 3 + k] == g * 3 + k;
    }
  }
  expect(graphs_ok, std::string(label) + ": graph callbacks ran " + std::to_string(tags.size()) + " times, or out of order");

  const hd::BackendStats st = engine->stats();
  expect(st.completed == kStreams * kEager + kGraphs * kReplays * 3, std::string(label) + ": completed count");
  expect(st.outstanding_eager == 0 && st.outstanding_graph == 0 && st.unannounced == 0,
         std::string(label) + ": nothing outstanding or unannounced");
  const hd::ShutdownOutcome out = engine->shutdown(std::chrono::seconds(5));
  expect(out.drained && out.not_run.empty(), std::string(label) + ": shutdown drained");
  std::printf("%s: ok (%lld callbacks)\n", label, static_cast<long long>(st.completed));
}

// Shutdown with work still queued behind a long kernel: bounded, exact report, and the stream
// is answered (not run) when it gets there.
void shutdown_with_pending(const char* label, hd::Mode mode, hd::SimDeviceConfig config) {
  hd::EngineOptions opts;
  opts.mode = mode;
  auto engine = hd::Engine::create(opts, std::make_shared<hd::SimDevice>(config), "", hd::RuntimeModePolicy{});
  hd::SimStream stream(64);
  auto log = std::make_shared<hd::CallLog>();
  stream.begin_capture();
  check(engine->launch(stream.handle(), std::make_shared<hd::AppendTag>(log, -1)), "captured launch");
  auto body = stream.end_capture();
  check(stream.busy(0.3), "busy");
  for (int i = 0; i < 5; ++i) check(engine->launch(stream.handle(), std::make_shared<hd::AppendTag>(log, i)), "launch");
  engine->announce(1);
  check(stream.replay(body), "replay");
  const hd::ShutdownOutcome out = engine->shutdown(std::chrono::milliseconds(10));
  expect(!out.drained && out.not_run.size() == 5 && out.graph_callbacks_not_run == 1 && out.graph_callbacks_alive == 1,
         std::string(label) + ": shutdown report");
  for (std::size_t i = 0; i < out.not_run.size(); ++i) {
    expect(out.not_run[i]->describe() == "CallLog.append(" + std::to_string(i) + ")", std::string(label) + ": report order");
  }
  expect(stream.synchronize(10.0), std::string(label) + ": the stream was left waiting");
  body.reset();
  expect(log->size() == 0, std::string(label) + ": a callback ran after shutdown");
  expect(engine->stats().discarded == 6, std::string(label) + ": discarded count");
  std::printf("%s: shutdown ok\n", label);
}

}  // namespace

int main() {
  const long long live_before = hd::Callback::live_count().load();
  run("blocking", hd::Mode::Blocking, {}, hd::Backend::Blocking);
  run("hostfunc_v2", hd::Mode::Spin, {}, hd::Backend::HostfuncV2);
  run("doorbell/memops", hd::Mode::Spin, {false, true, 13000, 13000, false}, hd::Backend::Doorbell);
  run("doorbell/queue", hd::Mode::Spin, {false, true, 13000, 13000, true}, hd::Backend::Doorbell);
  shutdown_with_pending("blocking", hd::Mode::Blocking, {});
  shutdown_with_pending("hostfunc_v2", hd::Mode::Spin, {});
  shutdown_with_pending("doorbell/memops", hd::Mode::Spin, {false, true, 13000, 13000, false});
  shutdown_with_pending("doorbell/queue", hd::Mode::Spin, {false, true, 13000, 13000, true});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // detached workers let go last
  expect(hd::Callback::live_count().load() == live_before, "every callback was destroyed");
  return failures == 0 ? 0 : 1;
}
