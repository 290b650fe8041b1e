package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestTemplateImages: by default each component runs the image `make
// images` names for it, <image.registry>/<component>:<appVersion>;
// image.registry and image.tag move all three; the old image.repository
// stops the render saying what replaced it.
func TestTemplateImages(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(chartDir(t), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion: "?([^"\s]+)"?`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	appVersion := string(m[1])

	check := func(mf manifests, registry, tag string) {
		t.Helper()
		var ctrl, ui appsv1.Deployment
		get(t, mf, "Deployment", controllerName, &ctrl)
		get(t, mf, "Deployment", uiName, &ui)
		_, node := nodeDaemonSet(t, mf)
		for name, got := range map[string]string{
			"kairon-controller": onlyContainer(t, ctrl.Spec.Template.Spec).Image,
			"kairon-ui":         onlyContainer(t, ui.Spec.Template.Spec).Image,
			"kairon-node":       node.Image,
		} {
			if want := registry + "/" + name + ":" + tag; got != want {
				t.Errorf("%s image %q, want %q", name, got, want)
			}
		}
	}
	check(render(t, setArgs([]string{"ui.enabled=true"})...), "ghcr.io/zyvor", appVersion)
	check(render(t, setArgs([]string{"ui.enabled=true", "image.registry=registry.example.com/kairon", "image.tag=dev"})...),
		"registry.example.com/kairon", "dev")

	if msg := renderError(t, setArgs([]string{"image.repository=registry.example.com/kairon"})...); !strings.Contains(msg, "image.registry") {
		t.Errorf("image.repository renders, or fails without naming image.registry: %q", msg)
	}
}

// TestTemplateNodeAgentOutlivesItsPod: the agent shares the host's PID
// namespace and runs with --vm-scope=host, so its VMs are neither in its
// pod's PID namespace nor in its cgroups, and it shares the host's record
// of VM uids with them (docs/design/node-agent-lifecycle.md). The sim
// backend runs no VM and gets no --vm-scope.
func TestTemplateNodeAgentOutlivesItsPod(t *testing.T) {
	ds, c := nodeDaemonSet(t, render(t))
	if !ds.Spec.Template.Spec.HostPID {
		t.Error("the node agent does not share the host's PID namespace: its VMs would die with its pod")
	}
	if !slices.Contains(c.Args, "--vm-scope=host") {
		t.Errorf("the node agent's args %q lack --vm-scope=host", c.Args)
	}
	if hp, ok := hostPathVolumes(ds, c)["/run/kairon"]; !ok || hp.Path != "/run/kairon" {
		t.Errorf("/run/kairon is not the host's: %+v", hp)
	}
	_, c = nodeDaemonSet(t, render(t, setArgs([]string{"node.backend=sim"})...))
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--vm-scope") }) {
		t.Errorf("the sim backend gets %q", c.Args)
	}
}
