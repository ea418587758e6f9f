-- Argo CD health of a Helmhive RunnerPool (docs/install.md, "Argo CD and Flux"): the operator has
-- reconciled this generation (Ready True, and a JobPod pool's warm pods ready), its credential Secret
-- is there, and its runners are up to the desired count.
local hs = {status = "Progressing", message = "waiting for the operator to reconcile the pool"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "the operator has not reconciled generation " .. obj.metadata.generation .. " yet"
  return hs
end
local found = {}
for _, c in ipairs(obj.status.conditions) do
  found[c.type] = c
end
local function said(c)
  local text = c.type .. " " .. (c.reason or "")
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end
local ready = found["Ready"]
if ready == nil then
  return hs
end
if ready.status == "False" then
  hs.status = "Degraded"
  hs.message = said(ready)
  return hs
end
if ready.status ~= "True" then
  -- Unknown: the operator has not applied the pool's objects yet.
  hs.message = said(ready)
  return hs
end
local credential = found["CredentialAvailable"]
if credential ~= nil and credential.status == "False" then
  -- Applied with the pool in one directory, the Secret may come a moment later.
  hs.message = said(credential)
  return hs
end
local warm = found["WarmPodsReady"]
if warm ~= nil and warm.status == "False" then
  if warm.reason == "WarmPodFailing" or warm.reason == "WarmPodsNotKept" then
    hs.status = "Degraded"
  end
  hs.message = said(warm)
  return hs
end
local desired = obj.status.desiredReplicas or 0
local readyReplicas = obj.status.readyReplicas or 0
if readyReplicas < desired then
  hs.message = readyReplicas .. " of " .. desired .. " runner pods ready"
  return hs
end
hs.status = "Healthy"
hs.message = said(ready)
return hs
