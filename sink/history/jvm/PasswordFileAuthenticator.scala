// HiveServer2 CUSTOM authentication for the history job's JDBC/ODBC endpoint
// (sink/history/thrift.py). Hive instantiates the class by name; it asks the job's Python side,
// which checks the user and password against the broker's password file (scrypt: not in the
// JDK). Compiled with the Scala compiler that ships inside pyspark (a JRE is enough):
// sink/history/thrift.py builds it on first use.
package mqtthistory

import javax.security.sasl.AuthenticationException
import org.apache.hive.service.auth.PasswdAuthenticationProvider

trait PasswordCheck {
  def check(user: String, password: String): Boolean
}

object PasswordCheckHolder {
  @volatile var checker: PasswordCheck = null
  def set(c: PasswordCheck): Unit = { checker = c }
}

class PasswordFileAuthenticator extends PasswdAuthenticationProvider {
  override def Authenticate(user: String, password: String): Unit = {
    val c = PasswordCheckHolder.checker
    val ok = c != null && user != null && password != null &&
      (try c.check(user, password) catch { case _: Throwable => false })
    if (!ok) throw new AuthenticationException("wrong user name or password")
  }
}
