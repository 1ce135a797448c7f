package api

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/api/openapi"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// OpenAPIPath is where the server publishes its OpenAPI document.
const OpenAPIPath = "/api/openapi.json"

// OpenAPI is the OpenAPI 3.1 document of a server with these domains, built
// without dependencies (for `better-compute openapi`).
func OpenAPI(domains []rpc.Domain) ([]byte, error) {
	descriptors := (&Server{}).systemMethods()
	for _, domain := range domains {
		descriptors = append(descriptors, domain(rpc.Deps{})...)
	}
	reg, _, err := Served(descriptors)
	if err != nil {
		return nil, err
	}
	return openAPIJSON(reg, descriptors)
}

// openAPIJSON is the document of reg, whose served methods are descriptors.
func openAPIJSON(reg *core.Registry, descriptors []rpc.Descriptor) ([]byte, error) {
	served := make(map[string]openapi.Served, len(descriptors))
	for _, d := range descriptors {
		info := d.Info()
		served[info.Name] = openapi.Served{Output: info.Output}
	}
	info := openapi.Info{APIVersion: APIVersion, Build: buildinfo.Get().Version, SessionCookie: iam.SessionCookie}
	return openapi.JSON(info, reg, served)
}

// handleOpenAPI is GET /api/openapi.json: the document, built on first use.
func (s *Server) handleOpenAPI(c *gin.Context) {
	doc, err := s.openapi()
	if err != nil {
		writeError(c, core.Wrap(core.CodeInternal, err, "the OpenAPI document could not be built"))
		return
	}
	c.Data(http.StatusOK, "application/json", doc)
}
