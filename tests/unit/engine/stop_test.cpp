#include "kiln/engine/stop.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/engine/sampler.h"  // Rng, for the randomized splits

namespace kiln::engine {
namespace {

// Feeds the pieces; returns everything emitted (including flush when not stopped).
struct Outcome {
  std::string text;
  bool stopped = false;
  int32_t stop_index = -1;
  std::vector<std::string> emitted;  // per feed
};

Outcome feed_all(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  Outcome run;
  for (const auto& piece : pieces) {
    auto r = m.feed(piece);
    run.emitted.push_back(r.text);
    run.text += r.text;
    if (r.stopped) {
      run.stopped = true;
      run.stop_index = r.stop_index;
    }
  }
  if (!run.stopped) run.text += m.flush();
  return run;
}

TEST(StopTokens, ContainsExactlyItsIds) {
  StopTokens t({128009, 2, 128001, 2});
  EXPECT_EQ(t.ids(), (std::vector<int32_t>{2, 128001, 128009}));
  EXPECT_TRUE(t.contains(2));
  EXPECT_TRUE(t.contains(128009));
  EXPECT_FALSE(t.contains(3));
  t.add(3);
  t.add(3);
  EXPECT_TRUE(t.contains(3));
  EXPECT_EQ(t.ids().size(), 4u);
  EXPECT_FALSE(StopTokens().contains(0));
}

TEST(StopMatcher, MatchesAcrossTokenBoundaries) {
  StopMatcher m({"lo W"});
  auto r = m.feed("Hel");
  EXPECT_EQ(r.text, "He");  // "l" could start "lo W"
  EXPECT_FALSE(r.stopped);
  r = m.feed("lo W");
  EXPECT_EQ(r.text, "l");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_index, 0);
  r = m.feed("orld");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, HeldTextIsReleasedWhenContinuationDiverges) {
  StopMatcher m({"lo W"});
  EXPECT_EQ(m.feed("Hel").text, "He");
  EXPECT_EQ(m.feed("lo").text, "l");
  EXPECT_EQ(m.num_held_bytes(), 2u);
  EXPECT_EQ(m.feed(" X").text, "lo X");
  EXPECT_EQ(m.num_held_bytes(), 0u);
  EXPECT_EQ(m.feed("lo ").text, "");
  EXPECT_EQ(m.flush(), "lo ");
  EXPECT_FALSE(m.stopped());
}

// flush() ends the text: a partial match does not continue into a later feed (this used to
// trip an assert when the engine happened to flush before its last feed).
TEST(StopMatcher, FeedAfterFlushStartsClean) {
  StopMatcher m({"lo W"});
  EXPECT_EQ(m.feed("Hello").text, "Hel");
  EXPECT_EQ(m.flush(), "lo");
  EXPECT_EQ(m.num_held_bytes(), 0u);
  const StopMatcher::Result r = m.feed(" World");  // " W" alone is no match
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, " World");
}

TEST(StopMatcher, EarliestCompletedStopWins) {
  Outcome r = feed_all({"World", "lo"}, {"Hello World"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "Hel");
  EXPECT_EQ(r.stop_index, 1);
  // "bc" completes before "abcd" does, however the text is split.
  for (const auto& pieces :
       std::vector<std::vector<std::string>>{{"xabcd"}, {"x", "a", "b", "c", "d"}, {"xab", "cd"}}) {
    r = feed_all({"abcd", "bc"}, pieces);
    EXPECT_EQ(r.text, "xa");
    EXPECT_EQ(r.stop_index, 1);
  }
}

TEST(StopMatcher, StopThatIsPrefixOfAnother) {
  Outcome r = feed_all({"abc", "ab"}, {"x", "a", "bc"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.stop_index, 1);  // "ab" completed first
  // Same end: the longer one (earlier start) wins, whatever the list order.
  r = feed_all({"ab", "xab"}, {"zzx", "ab"});
  EXPECT_EQ(r.text, "zz");
  EXPECT_EQ(r.stop_index, 1);
  r = feed_all({"xab", "ab"}, {"zzxab"});
  EXPECT_EQ(r.text, "zz");
  EXPECT_EQ(r.stop_index, 0);
  // The longer one never completes: the text before the shorter's match is all there is.
  r = feed_all({"abc", "ab"}, {"xabd"});
  EXPECT_EQ(r.text, "x");
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.feed("abc").text, "abc");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, NeverSplitsACodePoint) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("caf\xC3").text, "caf");  // é = C3 A9
  EXPECT_EQ(m.feed("\xA9 ").text, "\xC3\xA9 ");
  // A 4-byte emoji (F0 9F 98 80) arriving byte by byte.
  EXPECT_EQ(m.feed("\xF0").text, "");
  EXPECT_EQ(m.feed("\x9F").text, "");
  EXPECT_EQ(m.feed("\x98").text, "");
  EXPECT_EQ(m.feed("\x80!").text, "\xF0\x9F\x98\x80!");
  // Held at the end: flush returns the raw bytes.
  EXPECT_EQ(m.feed("\xE4\xB8").text, "");
  EXPECT_EQ(m.flush(), "\xE4\xB8");
}

TEST(StopMatcher, MultibyteStopString) {
  StopMatcher m({"\xC3\xA9!"});  // "é!"
  EXPECT_EQ(m.feed("x\xC3").text, "x");
  EXPECT_EQ(m.feed("\xA9").text, "");  // "é" may begin the stop
  const auto r = m.feed("?");
  EXPECT_EQ(r.text, "\xC3\xA9?");
  EXPECT_FALSE(r.stopped);
  const auto s = m.feed("\xC3\xA9!tail");
  EXPECT_EQ(s.text, "");
  EXPECT_TRUE(s.stopped);
}

TEST(StopMatcher, Utf8CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xC3"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xC3\xA9"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xE4\xB8"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x98\x80"), 5u);
  // Invalid bytes pass: stray continuation bytes, a bad lead byte.
  EXPECT_EQ(utf8_complete_prefix("\x80\x80"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\x80\x80\x80\x80"), 5u);
  EXPECT_EQ(utf8_complete_prefix("a\xFF"), 2u);
}

TEST(StopMatcher, ValidationRejectsEmptyAndOversizedStops) {
  EXPECT_TRUE(validate_stops({"a", "\n\n"}).ok());
  const Status empty = validate_stops({"a", ""});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos);
  EXPECT_FALSE(StopMatcher::create({""}).ok());
  EXPECT_FALSE(validate_stops(std::vector<std::string>(kMaxStopStrings + 1, "x")).ok());
  EXPECT_FALSE(validate_stops({std::string(kMaxStopStringBytes + 1, 'x')}).ok());
  EXPECT_TRUE(StopMatcher::create({"x"}).ok());
  // An unvalidated empty stop string is ignored rather than matching everywhere.
  EXPECT_EQ(feed_all({""}, {"abc"}).text, "abc");
}

// Reference: the stop with the earliest end, then the longest; text before it.
Outcome oracle(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t end = 1; end <= text.size(); ++end) {
    int32_t best = -1;
    for (size_t s = 0; s < stops.size(); ++s) {
      const auto& st = stops[s];
      if (st.size() <= end && text.compare(end - st.size(), st.size(), st) == 0 &&
          (best < 0 || st.size() > stops[best].size())) {
        best = static_cast<int32_t>(s);
      }
    }
    if (best >= 0) return {text.substr(0, end - stops[best].size()), true, best, {}};
  }
  return {text, false, -1, {}};
}

TEST(StopMatcher, RandomSplitsAgreeWithOracle) {
  // Two alphabets: one with multibyte characters, one of two letters (stops that overlap
  // themselves, which exercises the automaton's fallbacks).
  const std::vector<std::vector<std::string>> alphabets = {
      {"a", "b", "c", "\xC3\xA9", "\xE2\x82\xAC"}, {"a", "b"}};  // é €
  Rng rng(2024);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng.next() % n); };
  for (int trial = 0; trial < 6000; ++trial) {
    const auto& alphabet = alphabets[trial % 2];
    std::vector<std::string> stops(1 + pick(3));
    for (auto& s : stops) {
      const size_t len = 1 + pick(5);
      for (size_t i = 0; i < len; ++i) s += alphabet[pick(alphabet.size())];
    }
    std::string text;
    const size_t len = pick(30);
    for (size_t i = 0; i < len; ++i) text += alphabet[pick(alphabet.size())];
    // Random byte splits (they may cut code points).
    std::vector<std::string> pieces;
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = std::min(text.size() - pos, 1 + pick(5));
      pieces.push_back(text.substr(pos, n));
      pos += n;
    }
    const Outcome want = oracle(stops, text);
    const Outcome got = feed_all(stops, pieces);
    ASSERT_EQ(got.text, want.text) << "trial " << trial;
    ASSERT_EQ(got.stopped, want.stopped) << "trial " << trial;
    ASSERT_EQ(got.stop_index, want.stop_index) << "trial " << trial;
    // Every emitted piece of a non-final feed is whole code points.
    for (const auto& e : got.emitted) ASSERT_EQ(utf8_complete_prefix(e), e.size()) << trial;
  }
}

}  // namespace
}  // namespace kiln::engine
