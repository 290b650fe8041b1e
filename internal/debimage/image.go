package debimage

import (
	"fmt"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Layer is one layer of an image: its files, and what its history entry
// says made it.
type Layer struct {
	Tree      Tree
	CreatedBy string
}

// Assemble writes each layer's tree as a tar under work (which must
// outlive the image's use: the layers are read from there) and puts the
// layers and cfg together as a linux/amd64 OCI image dated date, its
// history entries saying creator made them.
func Assemble(work string, date time.Time, creator string, layers []Layer, cfg v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: date}
	for i, ls := range layers {
		p := filepath.Join(work, fmt.Sprintf("layer-%d.tar", i+1))
		if err := ls.Tree.WriteTar(p, date); err != nil {
			return nil, err
		}
		l, err := tarball.LayerFromFile(p, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: creator + ": " + ls.CreatedBy, Comment: "built by Kairon's " + creator}})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", created
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}
