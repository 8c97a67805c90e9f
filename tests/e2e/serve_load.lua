-- serve_load.lua - wrk script of serve_load.sh: a mix of small syntheses (both endpoints, several
-- formats, streamed and whole) and plain GETs; counts 5xx and other statuses per thread and
-- writes the totals to $LOAD_REPORT when done.
local bodies = {
  {"POST", "/v1/tts", '{"text": "Load one.", "frames": 3, "seed": 1, "format": "pcm"}'},
  {"POST", "/v1/tts", '{"text": "Load two.", "frames": 2, "seed": 2, "format": "wav", "streaming": true}'},
  {"POST", "/v1/audio/speech", '{"input": "Load three.", "voice": "default", "frames": 2, "seed": 3, "response_format": "mp3"}'},
  {"POST", "/v1/tts", '{"text": "Load four.", "frames": 2, "seed": 4, "format": "opus"}'},
  {"GET", "/health", nil},
  {"GET", "/v1/models", nil},
  {"POST", "/v1/tts", '{"text": "", "frames": 2}'},
}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) n = 0; s2 = 0; s4 = 0; s5 = 0; other = 0; odd4 = 0; first4 = "" end
function request()
  n = n + 1
  local b = bodies[(n % #bodies) + 1]
  if b[3] then
    return wrk.format(b[1], b[2], {["Content-Type"] = "application/json"}, b[3])
  end
  return wrk.format(b[1], b[2])
end
function response(status, headers, body)
  if status >= 500 then s5 = s5 + 1
  elseif status >= 400 then
    s4 = s4 + 1
    -- a 4xx other than the bad body's is named in the report (status and the start of its body)
    if not (status == 400 and body:find("empty_text", 1, true)) then
      odd4 = odd4 + 1
      if first4 == "" then first4 = status .. ":" .. body:sub(1, 160):gsub("%s", "_") end
    end
  elseif status >= 200 and status < 300 then s2 = s2 + 1
  else other = other + 1 end
end
function done(summary, latency, requests)
  local t2, t4, t5, to, o4, f4 = 0, 0, 0, 0, 0, "-"
  for _, t in ipairs(threads) do
    t2 = t2 + t:get("s2"); t4 = t4 + t:get("s4"); t5 = t5 + t:get("s5"); to = to + t:get("other")
    o4 = o4 + t:get("odd4")
    if t:get("first4") ~= "" and f4 == "-" then f4 = t:get("first4") end
  end
  local e = summary.errors
  local f = io.open(os.getenv("LOAD_REPORT"), "w")
  f:write(string.format("requests=%d ok=%d client_errors=%d server_errors=%d other=%d connect=%d read=%d write=%d timeout=%d odd_4xx=%d first_odd_4xx=%s\n",
    summary.requests, t2, t4, t5, to, e.connect, e.read, e.write, e.timeout, o4, f4))
  f:close()
end
