package images

import "time"

// Metrics receives what the store measures. The node agent implements it
// with Prometheus; a nil Metrics in Options records nothing. Calls come
// from any goroutine.
type Metrics interface {
	// PullDuration is how long downloading and verifying one image that
	// was not cached took (manifest, config and layers).
	PullDuration(d time.Duration)
	// ConvertDuration is how long flattening it into its filesystem image
	// took.
	ConvertDuration(d time.Duration)
	// CacheHit is an Ensure served from the cache; CacheMiss one that
	// pulled, or waited for another Ensure's pull of the same image.
	CacheHit()
	CacheMiss()
	// PullFailed is an Ensure or Resolve that failed, by reason.
	PullFailed(reason Reason)
	// CacheUsage is the cache after every change: images and bytes on
	// disk.
	CacheUsage(images int, bytes int64)
}

type noMetrics struct{}

func (noMetrics) PullDuration(time.Duration)    {}
func (noMetrics) ConvertDuration(time.Duration) {}
func (noMetrics) CacheHit()                     {}
func (noMetrics) CacheMiss()                    {}
func (noMetrics) PullFailed(Reason)             {}
func (noMetrics) CacheUsage(int, int64)         {}
