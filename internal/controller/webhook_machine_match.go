package controller

import admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

// MachineWebhookMatchConditions say which Machine writes the API server
// sends to the Machine webhook at all: creates, a change of spec.nodeName
// and a start of a stopped Machine, the only updates MachineValidator
// judges (ValidateUpdate). Every other update (a claim's take, labels,
// finalizers, a hand-back) skips the round trip to kairon-controller, so
// it costs a bind nothing and still goes through while the controller is
// down under failurePolicy Fail. The chart's webhook carries exactly these
// (internal/chart tests compare them).
var MachineWebhookMatchConditions = []admissionregistrationv1.MatchCondition{{
	Name: "create-placement-or-start",
	Expression: "request.operation == 'CREATE'" +
		" || object.spec.?nodeName.orValue('') != oldObject.spec.?nodeName.orValue('')" +
		" || (oldObject.spec.?powerState.orValue('') == 'Stopped' && object.spec.?powerState.orValue('') != 'Stopped')",
}}
