//! The real Synapse the Matrix tests talk to: `.ci/test` starts it (`.ci/synapse`) and passes its
//! URL and registration secret in `PERCH_TEST_SYNAPSE_URL` and `PERCH_TEST_SYNAPSE_SECRET`.
//! Users are registered through Synapse's shared-secret admin API; a test plays the human with
//! plain client-server API calls (or a second matrix-sdk client, in the encrypted tests).
#![allow(
    dead_code,
    reason = "a harness shared by several suites, each using part of it"
)]

use hmac::{KeyInit, Mac};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const NOT_SET: &str = "is not set: run ./.ci/test, which starts Synapse";

/// The homeserver under test.
#[derive(Debug, Clone)]
pub struct Synapse {
    pub url: String,
    secret: String,
    http: reqwest::Client,
}

/// A registered account, with an access token of its own (a device named "registration").
#[derive(Debug, Clone)]
pub struct Account {
    pub url: String,
    pub user_id: String,
    pub localpart: String,
    pub password: String,
    pub access_token: String,
    http: reqwest::Client,
}

impl Synapse {
    /// The Synapse `.ci/test` started; panics, naming the fix, when there is none.
    pub fn from_env() -> Synapse {
        let url = std::env::var("PERCH_TEST_SYNAPSE_URL")
            .unwrap_or_else(|_| panic!("PERCH_TEST_SYNAPSE_URL {NOT_SET}"));
        let secret = std::env::var("PERCH_TEST_SYNAPSE_SECRET")
            .unwrap_or_else(|_| panic!("PERCH_TEST_SYNAPSE_SECRET {NOT_SET}"));
        Synapse {
            url: url.trim_end_matches('/').to_owned(),
            secret,
            http: reqwest::Client::new(),
        }
    }

    /// Registers a new user named `<prefix><unique suffix>` through the shared-secret API.
    pub async fn register(&self, prefix: &str) -> Account {
        self.register_named(prefix, None).await
    }

    /// Like [`Synapse::register`], with a display name.
    pub async fn register_named(&self, prefix: &str, display_name: Option<&str>) -> Account {
        let suffix = uuid::Uuid::now_v7().simple().to_string();
        let localpart = format!("{prefix}{}", &suffix[suffix.len() - 12..]);
        let password = format!("pw-{suffix}");
        let endpoint = format!("{}/_synapse/admin/v1/register", self.url);
        let nonce = self.http.get(&endpoint).send().await.unwrap();
        let nonce: Value = nonce.json().await.unwrap();
        let nonce = nonce["nonce"].as_str().unwrap().to_owned();
        let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(self.secret.as_bytes()).unwrap();
        mac.update(format!("{nonce}\0{localpart}\0{password}\0notadmin").as_bytes());
        let mac: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let mut body = json!({
            "nonce": nonce,
            "username": localpart,
            "password": password,
            "admin": false,
            "mac": mac,
        });
        if let Some(name) = display_name {
            body["displayname"] = json!(name);
        }
        let response = self.http.post(&endpoint).json(&body).send().await.unwrap();
        let status = response.status();
        let registered: Value = response.json().await.unwrap();
        assert!(status.is_success(), "registering {localpart}: {registered}");
        Account {
            url: self.url.clone(),
            user_id: registered["user_id"].as_str().unwrap().to_owned(),
            localpart,
            password,
            access_token: registered["access_token"].as_str().unwrap().to_owned(),
            http: self.http.clone(),
        }
    }
}

fn encode(segment: &str) -> String {
    url::form_urlencoded::byte_serialize(segment.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

impl Account {
    /// One client-server API call as this account; panics unless it succeeds.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.try_call(method.clone(), path, body).await;
        assert!(
            status.is_success(),
            "{method} {path} as {}: {status} {value}",
            self.user_id
        );
        value
    }

    /// One client-server API call as this account.
    pub async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (reqwest::StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}/_matrix/client/v3{path}", self.url))
            .bearer_auth(&self.access_token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let value = response.json().await.unwrap_or(Value::Null);
        (status, value)
    }

    /// Creates a room with `extra` merged into the request; returns its id.
    pub async fn create_room(&self, extra: Value) -> String {
        let mut body = json!({ "preset": "private_chat" });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let created = self
            .call(reqwest::Method::POST, "/createRoom", Some(body))
            .await;
        created["room_id"].as_str().unwrap().to_owned()
    }

    /// Creates a direct-message room and invites `invitee`.
    pub async fn create_dm(&self, invitee: &str) -> String {
        self.create_room(json!({ "invite": [invitee], "is_direct": true }))
            .await
    }

    /// [`Account::create_dm`], once `invitee` has joined it.
    pub async fn open_dm(&self, invitee: &str) -> String {
        let room = self.create_dm(invitee).await;
        self.wait_joined(&room, invitee).await;
        room
    }

    pub async fn join(&self, room: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/join/{}", encode(room)),
            Some(json!({})),
        )
        .await;
    }

    pub async fn invite(&self, room: &str, user: &str) {
        self.call(
            reqwest::Method::POST,
            &format!("/rooms/{}/invite", encode(room)),
            Some(json!({ "user_id": user })),
        )
        .await;
    }

    /// Sends an event with `content`; returns its id.
    pub async fn send(&self, room: &str, event_type: &str, content: Value) -> String {
        let txn = uuid::Uuid::now_v7().simple().to_string();
        let sent = self
            .call(
                reqwest::Method::PUT,
                &format!("/rooms/{}/send/{event_type}/{txn}", encode(room)),
                Some(content),
            )
            .await;
        sent["event_id"].as_str().unwrap().to_owned()
    }

    /// Sends a plain `m.text` message; returns its id.
    pub async fn say(&self, room: &str, text: &str) -> String {
        self.send(
            room,
            "m.room.message",
            json!({ "msgtype": "m.text", "body": text }),
        )
        .await
    }

    /// The event `event_id` as the server has it.
    pub async fn event(&self, room: &str, event_id: &str) -> Value {
        self.call(
            reqwest::Method::GET,
            &format!("/rooms/{}/event/{}", encode(room), encode(event_id)),
            None,
        )
        .await
    }

    /// The room's latest events, newest first.
    pub async fn messages(&self, room: &str, limit: u32) -> Vec<Value> {
        let page = self
            .call(
                reqwest::Method::GET,
                &format!("/rooms/{}/messages?dir=b&limit={limit}", encode(room)),
                None,
            )
            .await;
        page["chunk"].as_array().cloned().unwrap_or_default()
    }

    /// `user`'s membership in `room` (`join`, `invite`, ...), as this account sees it.
    pub async fn membership(&self, room: &str, user: &str) -> Option<String> {
        let (status, state) = self
            .try_call(
                reqwest::Method::GET,
                &format!(
                    "/rooms/{}/state/m.room.member/{}",
                    encode(room),
                    encode(user)
                ),
                None,
            )
            .await;
        status
            .is_success()
            .then(|| state["membership"].as_str().map(str::to_owned))
            .flatten()
    }

    /// Waits until `user` has joined `room`.
    pub async fn wait_joined(&self, room: &str, user: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.membership(room, user).await.as_deref() != Some("join") {
            assert!(
                Instant::now() < deadline,
                "{user} did not join {room} in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// This account's devices.
    pub async fn devices(&self) -> Vec<Value> {
        let devices = self.call(reqwest::Method::GET, "/devices", None).await;
        devices["devices"].as_array().cloned().unwrap_or_default()
    }
}
