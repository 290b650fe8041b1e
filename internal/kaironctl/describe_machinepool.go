package kaironctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// conditionImageResolved is the pool condition kairon-controller sets on a
// pool with an OCI image (internal/controller/pool_image.go).
const conditionImageResolved = "ImageResolved"

// describeMachinePool says what image a pool's members run: the template's
// reference, the digest the pool pinned it to and when it asked the
// registry, and its members grouped by the image they were created with
// (after a rollout restart, claimed members keep the old digest).
func describeMachinePool(ctx context.Context, o *Options, obj *unstructured.Unstructured, w io.Writer) error {
	var pool kaironv1.MachinePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &pool); err != nil {
		return fmt.Errorf("reading machinepool %q: %w", obj.GetName(), err)
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	var members kaironv1.MachineList
	if err := c.List(ctx, &members, client.InNamespace(pool.Namespace), client.MatchingLabels{kaironv1.LabelMachinePool: pool.Name}); err != nil {
		return fmt.Errorf("listing the members of machinepool %q: %w", pool.Name, err)
	}
	return printPoolImage(w, &pool, members.Items, o.Now())
}

// printPoolImage is the text after the JSON in `describe machinepool`.
func printPoolImage(w io.Writer, pool *kaironv1.MachinePool, members []kaironv1.Machine, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	ref := pool.Spec.Template.Spec.Image
	if ref == "" {
		ref = kaironv1.DefaultImage
	}
	cond := meta.FindStatusCondition(pool.Status.Conditions, conditionImageResolved)
	switch img := pool.Status.Image; {
	case !kaironv1.IsOCIImage(ref):
		fmt.Fprintf(tw, "Image:\t%s (built in: nothing to pin)\n", ref)
	case img == nil:
		fmt.Fprintf(tw, "Image:\t%s\n", ref)
		fmt.Fprintf(tw, "Pinned digest:\tnone yet: no member is created until there is one\n")
	default:
		fmt.Fprintf(tw, "Image:\t%s\n", ref)
		pinned := img.Digest
		if img.Reference != ref || (cond != nil && cond.ObservedGeneration < pool.Generation) {
			pinned += fmt.Sprintf(" (of %s, an earlier template: the pool is resolving the current one)", img.Reference)
		}
		fmt.Fprintf(tw, "Pinned digest:\t%s\n", pinned)
		switch {
		case strings.Contains(img.Reference, "@"):
			fmt.Fprintf(tw, "Resolved:\tnever asked: the reference is pinned by digest\n")
		case img.ResolvedAt == nil:
			fmt.Fprintf(tw, "Resolved:\tat an unknown time, for template %s\n", img.TemplateHash)
		default:
			at := img.ResolvedAt.UTC()
			fmt.Fprintf(tw, "Resolved:\t%s (%s ago), for template %s\n", at.Format(time.RFC3339), duration.HumanDuration(now.Sub(at)), img.TemplateHash)
		}
		runs := img.Reference
		if !strings.Contains(runs, "@") {
			runs += "@" + img.Digest
		}
		fmt.Fprintf(tw, "New members run:\t%s\n", runs)
	}
	if cond != nil && cond.Status != "True" {
		fmt.Fprintf(tw, "%s:\t%s (%s): %s\n", conditionImageResolved, cond.Status, cond.Reason, oneLine(cond.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printMembersByImage(w, members)
}

// printMembersByImage lists the images a pool's live members run, with
// how many of them are warm and how many claimed.
func printMembersByImage(w io.Writer, members []kaironv1.Machine) error {
	type count struct{ warm, claimed int }
	counts := map[string]*count{}
	for _, m := range members {
		if m.DeletionTimestamp != nil {
			continue
		}
		image := m.Spec.Image
		if image == "" {
			image = kaironv1.DefaultImage
		}
		c := counts[image]
		if c == nil {
			c = &count{}
			counts[image] = c
		}
		if m.Labels[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed {
			c.claimed++
		} else {
			c.warm++
		}
	}
	if len(counts) == 0 {
		_, err := fmt.Fprintln(w, "Members: none")
		return err
	}
	fmt.Fprintln(w, "Members by image:")
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	images := make([]string, 0, len(counts))
	for image := range counts {
		images = append(images, image)
	}
	slices.Sort(images)
	for _, image := range images {
		fmt.Fprintf(tw, "  %s\t%d warm, %d claimed\n", image, counts[image].warm, counts[image].claimed)
	}
	return tw.Flush()
}
