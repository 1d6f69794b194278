// Raw HTTP/1.1 over a loopback socket for the server tests that need the bytes as sent (status
// line, headers, SSE framing): one request per connection (Connection: close), the whole response
// read until the server closes. A failed connect gives "".
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace oscar::server::test {

inline std::string raw_roundtrip(uint16_t port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{120, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// POSTs a JSON `body` to `path`.
inline std::string raw_post(uint16_t port, const std::string& path, const std::string& body) {
  return raw_roundtrip(port, "POST " + path +
                                 " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                 "Content-Type: application/json\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body);
}

}  // namespace oscar::server::test
