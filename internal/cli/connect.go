package cli

import (
	"strings"

	"github.com/better-compute/better-compute/api"
)

// Connect resolves the connection a hand-written command of a method group
// calls with (the context named, else the current one and the
// environment), as the registry's commands do, and its client.
func Connect(o Options, named string) (*api.Client, Connection, error) {
	o = o.withDefaults()
	conn, err := o.connection(named)
	if err != nil {
		return nil, Connection{}, err
	}
	return &api.Client{BaseURL: strings.TrimRight(conn.API, "/"), Token: conn.Token, HTTP: o.HTTP}, conn, nil
}
