/* The socket calls of sockio.pxi, with the flags every supported platform understands. */
#ifndef BMQ_SOCKIO_H
#define BMQ_SOCKIO_H

#include <sys/types.h>
#include <sys/socket.h>

#ifndef MSG_NOSIGNAL
/* macOS has no MSG_NOSIGNAL; Python ignores SIGPIPE there too, so a broken pipe is an EPIPE. */
#define MSG_NOSIGNAL 0
#endif

#endif
