-- Argo CD health of a muralist.dev/v1alpha1 DiffusionJob (resource.customizations.health.muralist.dev_DiffusionJob).
-- Reads only what the operator writes: status.phase, status.progress, status.message and
-- status.observedGeneration. A status that is missing, or older than the spec, says nothing
-- yet about this revision of the job, so it is Progressing.
local hs = {}

local function progress(status)
  local p = status.progress
  if p == nil then
    return ""
  end
  if p.summary ~= nil and p.summary ~= "" then
    return p.summary .. " images"
  end
  if p.total ~= nil and p.total > 0 then
    return (p.completed or 0) .. "/" .. p.total .. " images"
  end
  return ""
end

-- "Running (3/16 images): rendering" without empty parts.
local function describe(phase, status)
  local text = phase
  local done = progress(status)
  if done ~= "" then
    text = text .. " (" .. done .. ")"
  end
  if status.message ~= nil and status.message ~= "" and status.message ~= phase then
    text = text .. ": " .. status.message
  end
  return text
end

local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report a status"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

local phase = status.phase
if phase == "Succeeded" then
  hs.status = "Healthy"
elseif phase == "Pending" or phase == "Running" or phase == "Restarting" then
  hs.status = "Progressing"
elseif phase == "Suspended" then
  hs.status = "Suspended"
elseif phase == "Failed" then
  hs.status = "Degraded"
else
  hs.status = "Unknown"
end
hs.message = describe(phase, status)
return hs
