-- The random-call fuzzer of the Lua API (fuzz/api_fuzz.lua): a short
-- fixed-seed pass per backend URL, so make test (and make check-sanitize,
-- which runs this suite under AddressSanitizer) keeps looking for the
-- kind of defect spec/38-api_regressions_spec.lua holds fixed. Longer
-- runs: make fuzz-api SEEDS=... CALLS=... (spec/README.md). FUZZ_SEED and
-- FUZZ_CALLS in the environment replace the fixed seed and call count, to
-- replay a failure this pass printed.
package.path = "fuzz/?.lua;" .. package.path
local fuzz = require("api_fuzz")
local helpers = require("helpers")

-- Seed 1: against the code before issue 31's fixes it fails at its call
-- 124 on memory: and sqlite: (an engine method called on a number raised
-- the VM's "attempt to index a number value"), so this pass is known to be
-- able to fail. A change to the grammar changes what a seed draws: check
-- again.
local SEED = tonumber(os.getenv("FUZZ_SEED") or "1")
local CALLS = tonumber(os.getenv("FUZZ_CALLS") or "500")

for _, url in ipairs(helpers.urls()) do
  describe(url, function()
    it(("random calls (seed %d, %d calls) raise only argument errors and error objects, invariants hold")
      :format(SEED, CALLS), function()
      print(("api fuzz: seed %d, %d calls, %s"):format(SEED, CALLS, url))
      local ok, report = fuzz.run({ seed = SEED, calls = CALLS, url = url, check_every = 100 })
      assert(ok, report)
    end)
  end)
end
