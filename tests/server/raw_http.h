// Raw HTTP/1.1 over a loopback socket for the server tests that need the bytes as sent (status
// line, headers, SSE framing): one request per connection (Connection: close), the whole response
// read until the server closes. A failed connect gives "" (raw_connect: -1).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace oscar::server::test {

// A connection to 127.0.0.1:port whose reads time out after 120 s; -1 when connect fails.
inline int raw_connect(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{120, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// `out` followed by everything the server sends until it closes; closes fd.
inline std::string raw_read_all(int fd, std::string out = "") {
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// The bytes of a request with a JSON `body` and Connection: close.
inline std::string raw_request(const std::string& method, const std::string& path,
                               const std::string& body) {
  return method + " " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
         "Content-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

inline std::string raw_roundtrip(uint16_t port, const std::string& request) {
  const int fd = raw_connect(port);
  if (fd < 0) return "";
  (void)!write(fd, request.data(), request.size());
  return raw_read_all(fd);
}

// POSTs a JSON `body` to `path`.
inline std::string raw_post(uint16_t port, const std::string& path, const std::string& body) {
  return raw_roundtrip(port, raw_request("POST", path, body));
}

}  // namespace oscar::server::test
