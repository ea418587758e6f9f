-- Argo CD health of a Helmhive Runner (docs/install.md, "Argo CD and Flux"), from its Schedulable
-- condition: Healthy when routing may assign it jobs; Suspended when an administrator drains or
-- disables it; Progressing while it registers, renews, catches up with a rotated credential or
-- runs its first qualification probes;
-- Degraded when it is unhealthy (its heartbeat or authentication failing, its credential missing
-- or revoked).
local hs = {status = "Progressing", message = "waiting for the runner to register"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local schedulable = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Schedulable" then
    schedulable = c
  end
end
if schedulable == nil then
  return hs
end
local said = schedulable.reason or ""
if schedulable.message ~= nil and schedulable.message ~= "" then
  said = said .. ": " .. schedulable.message
end
hs.message = said
local suspended = {Draining = true, Disabled = true}
local starting = {NeverReported = true, LeaseMissing = true, CredentialRotated = true, HeartbeatHeld = true,
  AuthenticationUnknown = true, QualificationPending = true}
if schedulable.status == "True" then
  hs.status = "Healthy"
elseif suspended[schedulable.reason] then
  hs.status = "Suspended"
elseif starting[schedulable.reason] then
  hs.status = "Progressing"
else
  hs.status = "Degraded"
end
return hs
