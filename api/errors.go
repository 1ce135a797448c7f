package api

import (
	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/core"
)

// errorBody is the one error shape of the API:
// {"error":{"code":"INVALID_INPUT","message":"…","details":{…}}}.
type errorBody struct {
	Error *core.Error `json:"error"`
}

// writeError answers with err's contract code and status. Errors without a
// code become an opaque INTERNAL_ERROR; their cause goes to the log only.
func writeError(c *gin.Context, err error) {
	e := core.AsError(err)
	if e.Code == core.CodeInternal {
		logger(c).Error("internal error", "error", err.Error())
	}
	c.AbortWithStatusJSON(e.Code.HTTPStatus(), errorBody{Error: e})
}
