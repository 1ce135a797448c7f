package images_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// insertImage writes an available image row directly (the resolution tests
// need rows, not the registration path).
func insertImage(t *testing.T, s *store.Store, tenant, name, version, visibility string) string {
	t.Helper()
	id := core.NewID(images.IDPrefix)
	if _, err := s.Pool.Exec(context.Background(), `INSERT INTO images
		(id, tenant_id, name, version, format, sha256, size_bytes, visibility, state, created_by)
		VALUES ($1, $2, $3, $4, 'raw', $5, 1, $6, 'available', 'idn_x')`,
		id, tenant, name, version, strings.Repeat("a", 64), visibility); err != nil {
		t.Fatal(err)
	}
	return id
}

func isNotFound(err error) bool {
	var ce *core.Error
	return errors.As(err, &ce) && ce.Code == core.CodeNotFound
}

func TestResolveSeesOwnAndPublicImagesOnly(t *testing.T) {
	s := testenv.Store(t)
	ctx := context.Background()
	ownPrivate := insertImage(t, s, "acme", "debian", "12", coreimages.Private)
	otherPrivate := insertImage(t, s, "globex", "ubuntu", "24.04", coreimages.Private)
	otherPublic := insertImage(t, s, "root", "debian", "13", coreimages.Public)
	shadowed := insertImage(t, s, "root", "debian", "12", coreimages.Public)

	cases := []struct {
		name string
		ref  coreimages.Ref
		want string // "" for NOT_FOUND
	}{
		{"own by id", coreimages.Ref{ID: ownPrivate}, ownPrivate},
		{"public by id", coreimages.Ref{ID: otherPublic}, otherPublic},
		{"another tenant's private by id", coreimages.Ref{ID: otherPrivate}, ""},
		{"missing id", coreimages.Ref{ID: core.NewID(images.IDPrefix)}, ""},
		{"own name first", coreimages.Ref{Name: "debian", Version: "12"}, ownPrivate},
		{"public name", coreimages.Ref{Name: "debian", Version: "13"}, otherPublic},
		{"another tenant's private name", coreimages.Ref{Name: "ubuntu", Version: "24.04"}, ""},
		{"name without version", coreimages.Ref{Name: "debian"}, ""},
		{"id and name", coreimages.Ref{ID: ownPrivate, Name: "debian", Version: "12"}, ""},
		{"empty", coreimages.Ref{}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
				im, err := images.Resolve(ctx, tx, "acme", c.ref)
				if c.want == "" {
					if !isNotFound(err) {
						t.Fatalf("Resolve(%+v) = %+v, %v; want NOT_FOUND", c.ref, im, err)
					}
					return nil
				}
				if err != nil {
					return err
				}
				if im.ID != c.want {
					t.Fatalf("Resolve(%+v) = %s; want %s", c.ref, im.ID, c.want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	// The root tenant itself resolves its own debian@12, not acme's.
	err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		im, err := images.Resolve(ctx, tx, "root", coreimages.Ref{Name: "debian", Version: "12"})
		if err != nil {
			return err
		}
		if im.ID != shadowed {
			t.Fatalf("root's debian@12 = %s; want %s", im.ID, shadowed)
		}
		_, err = images.Get(ctx, tx, "root", ownPrivate)
		if !isNotFound(err) {
			t.Fatalf("root reads acme's private image: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
