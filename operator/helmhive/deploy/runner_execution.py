"""The ``helmhive-runner-execution`` ValidatingAdmissionPolicy: each runner pod writes only its own work.

RBAC lets every pod of a pool act on all AgentJobs, SessionBindings and artifact ConfigMaps in
its namespace; this policy narrows each write to the pod bound to the caller's token: the status
of jobs assigned to it (without touching assignment, profile binding or routing), its own
session bindings (never their resets; their compaction count only grows), its own ``helmhive-sessions-<pod>`` Secret, and
``*-artifacts`` ConfigMaps owned by an AgentJob, and (JobPod pools) only job pods of its own pool
that it drives: created without a token, host namespaces or other volumes than ``emptyDir`` and the
pool's link key, claimed only while warm, changed or deleted only when its own. ``docs/execution.md`` shows the same YAML,
checked by a test. Pure.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["EXECUTION_POLICY_NAME", "EXECUTION_POLICY_YAML", "build_runner_execution_policy"]

EXECUTION_POLICY_NAME = "helmhive-runner-execution"

EXECUTION_POLICY_YAML = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: helmhive-runner-execution
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["helmhive.dev"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["agentjobs/status"]
      - apiGroups: ["helmhive.dev"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE"]
        resources: ["sessionbindings", "sessionbindings/status"]
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["secrets"]
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE"]
        resources: ["configmaps"]
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["pods"]
  matchConditions:
    - name: runner-service-account
      expression: "request.userInfo.username.matches('^system:serviceaccount:[^:]+:helmhive-runner-[^:]+$')"
  variables:
    - name: podName
      expression: >-
        'authentication.kubernetes.io/pod-name' in request.userInfo.extra &&
        size(request.userInfo.extra['authentication.kubernetes.io/pod-name']) > 0 ?
        request.userInfo.extra['authentication.kubernetes.io/pod-name'][0] : ''
    - name: resource
      expression: "request.resource.resource"
    - name: pool
      expression: "request.userInfo.username.split(':')[3].substring(16)"
    - name: jobPod
      expression: "object.metadata.?labels.orValue({})"
    - name: oldJobPod
      expression: "oldObject.metadata.?labels.orValue({})"
  validations:
    - expression: "variables.podName != ''"
      messageExpression: >-
        'runner execution: the token of ' + request.userInfo.username + ' is not bound to a pod'
      reason: Forbidden
    - expression: >-
        variables.resource != 'agentjobs' ||
        (has(oldObject.status) && has(oldObject.status.assignment) &&
         oldObject.status.assignment.runner == variables.podName)
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may write the status only of jobs assigned to it, not ' + request.name
      reason: Forbidden
    - expression: >-
        variables.resource != 'agentjobs' ||
        (object.?status.?assignment == oldObject.?status.?assignment &&
         object.?status.?profile == oldObject.?status.?profile &&
         object.?status.?routing == oldObject.?status.?routing)
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may not change the assignment, profile binding or routing of ' + request.name
      reason: Forbidden
    - expression: >-
        variables.resource != 'sessionbindings' ||
        (object.spec.runner == variables.podName &&
         (request.operation != 'UPDATE' ||
          (oldObject.spec.runner == variables.podName &&
           object.?status.?resets.orValue(0) == oldObject.?status.?resets.orValue(0) &&
           object.?status.?lastResetAt.orValue('') == oldObject.?status.?lastResetAt.orValue(''))))
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may write only its own session bindings, and never their resets'
      reason: Forbidden
    - expression: >-
        variables.resource != 'sessionbindings' || request.operation != 'UPDATE' ||
        object.?status.?compactions.orValue(0) >= oldObject.?status.?compactions.orValue(0)
      messageExpression: >-
        'runner execution: status.compactions of session binding ' + request.name + ' only grows: each compaction is audited by its count'
      reason: Forbidden
    - expression: "variables.resource != 'secrets' || request.name == 'helmhive-sessions-' + variables.podName"
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may write only the Secret helmhive-sessions-' + variables.podName + ', not ' + request.name
      reason: Forbidden
    - expression: >-
        variables.resource != 'configmaps' ||
        (object.metadata.name.matches('-artifacts(-[0-9]+)?$') &&
         has(object.metadata.ownerReferences) &&
         object.metadata.ownerReferences.exists(r, r.kind == 'AgentJob' && r.apiVersion.startsWith('helmhive.dev/')))
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may create only job artifact ConfigMaps owned by an AgentJob'
      reason: Forbidden
    - expression: >-
        variables.resource != 'pods' || request.operation == 'DELETE' ||
        (variables.jobPod[?'app.kubernetes.io/component'].orValue('') == 'job-pod' &&
         variables.jobPod[?'helmhive.dev/pool'].orValue('') == variables.pool &&
         variables.jobPod[?'helmhive.dev/runner'].orValue('') == variables.podName)
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may write only job pods of its pool ' + variables.pool + ' labelled as driven by it'
      reason: Forbidden
    - expression: >-
        variables.resource != 'pods' || request.operation == 'CREATE' ||
        (variables.oldJobPod[?'app.kubernetes.io/component'].orValue('') == 'job-pod' &&
         variables.oldJobPod[?'helmhive.dev/pool'].orValue('') == variables.pool &&
         (variables.oldJobPod[?'helmhive.dev/runner'].orValue('') == variables.podName ||
          (request.operation == 'UPDATE' && variables.oldJobPod[?'helmhive.dev/warm'].orValue('') == 'true')))
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may claim only warm job pods of its pool, and change or delete only its own, not ' + request.name
      reason: Forbidden
    - expression: >-
        variables.resource != 'pods' || request.operation != 'CREATE' ||
        (object.spec.?automountServiceAccountToken.orValue(true) == false &&
         object.spec.?serviceAccountName.orValue('default') == 'default' &&
         !object.spec.?hostNetwork.orValue(false) && !object.spec.?hostPID.orValue(false) &&
         !object.spec.?hostIPC.orValue(false) &&
         object.spec.?volumes.orValue([]).all(v, has(v.emptyDir) ||
           (has(v.secret) && v.secret.secretName == variables.pool + '-jobpod-link')))
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may create a job pod only without a ServiceAccount token or host namespaces, with emptyDir volumes and the link key of its pool'
      reason: Forbidden
    - expression: >-
        variables.resource != 'pods' || request.operation != 'UPDATE' ||
        object.spec.containers.map(c, c.image) == oldObject.spec.containers.map(c, c.image)
      messageExpression: >-
        'runner execution: runner pod ' + variables.podName + ' may not change the images of job pod ' + request.name
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: helmhive-runner-execution
spec:
  policyName: helmhive-runner-execution
  validationActions: ["Deny"]
"""


def build_runner_execution_policy() -> list[dict[str, Any]]:
    """The policy and its binding, as dicts."""
    docs = [d for d in yaml.safe_load_all(EXECUTION_POLICY_YAML) if d]
    for doc in docs:
        doc["metadata"].setdefault("labels", {}).update(
            {"app.kubernetes.io/name": "helmhive", "app.kubernetes.io/part-of": "helmhive"}
        )
    return docs
